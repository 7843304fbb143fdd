#!/usr/bin/env bash
# FlashAttention-4's sm90 kernels as machine code, built here without a GPU (no device minutes),
# to set beside flexcp's (scripts/sass-diff.sh compiles those): FA4's entry points run under
# torch's fake tensors with its pinned CuTe DSL targeting sm_90a (scripts/fa4_sm90_ptx.py), the
# PTX they leave is assembled by the toolkit's ptxas, and each main kernel's SASS lands in
# OUT/<case>.sass with a count of the instructions that matter in OUT/summary.txt.
#   scripts/fa4-sass.sh [OUT] [cases...]   default .deps/fa4-sass, {bwd,fwd}-{causal,full}
# Its Python is .deps/fa4-venv: FA4 and the DSL at the versions fa4-pack.sh packs for the GPU
# host, and .venv's torch (scripts/python-env.sh; a .pth file, not a second copy). First run: a
# minute of downloads beside .venv's; then about 40 s per case on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.deps/fa4-sass}
shift || true
cases=("$@")
((${#cases[@]})) || cases=(bwd-causal bwd-full fwd-causal fwd-full)
torch_python=$(scripts/python-env.sh)
venv=.deps/fa4-venv
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
site_of() { "$1" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }
site_of "$torch_python" > "$(site_of "$venv/bin/python")/flexcp-torch.pth"
if ! "$venv/bin/python" -c "import flash_attn.cute" 2>/dev/null; then
  echo "fa4-sass: installing FlashAttention-4 and the CuTe DSL into $venv" >&2
  "$venv/bin/python" -m pip install -q flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 \
    quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 >&2
fi
# shellcheck source=scripts/cuobjdump.sh
source scripts/cuobjdump.sh  # sets `cuobjdump`
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
for c in "${cases[@]}"; do
  dump=$(mktemp -d)
  "$venv/bin/python" scripts/fa4_sm90_ptx.py "$dump" "$c" > "$out/$c.log" 2>&1 ||
    { tail -20 "$out/$c.log"; exit 1; }
  # The main kernel's module (the pre- and postprocessing kernels have their own).
  ptx=$(find "$dump" -name '*FlashAttention*Sm90*.ptx' | head -1)
  [[ -n $ptx ]] || { echo "fa4-sass: $c left no sm90 kernel PTX in $dump" >&2; exit 1; }
  /usr/local/cuda/bin/ptxas -arch=sm_90a -O3 -o "$out/$c.cubin" "$ptx"
  "$cuobjdump" --dump-sass "$out/$c.cubin" 2>/dev/null > "$out/$c.sass"
  rm -rf "$dump"
  sass=$(grep -E '^\s+/\*[0-9a-f]{4,6}\*/' "$out/$c.sass")
  count() { grep -cE "$1" <<< "$sass" || true; }
  printf '%s: %s instructions; HGMMA %s, MUFU.EX2 %s, FFMA %s, FMUL %s, FADD %s, LDS %s (LDS.64 %s), STS %s (STS.128 %s), BAR %s, LDL/STL %s; %s\n' \
    "$c" "$(wc -l <<< "$sass")" "$(count HGMMA)" "$(count MUFU.EX2)" "$(count ' FFMA ')" \
    "$(count ' FMUL ')" "$(count ' FADD ')" "$(count ' LDS')" "$(count 'LDS.64')" \
    "$(count ' STS')" "$(count 'STS.128')" "$(count ' BAR\.')" "$(count '\b(LDL|STL)\b')" \
    "$("$cuobjdump" --dump-resource-usage "$out/$c.cubin" 2>/dev/null | grep -oE 'REG:[0-9]+' | head -1)" \
    >> "$summary"
done
cat "$summary"
