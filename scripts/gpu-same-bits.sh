#!/usr/bin/env bash
# On a GPU host: do two builds of flexcp give the same bits? For a change meant not to alter any
# result (an instruction order, where a reduction's chain starts), both CLIs run the same saved
# inputs through `flexcp attn --device cuda` on a few masks (causal, documents, a window, full with
# softcap and a sink), and their outputs are compared byte for byte. With BACKWARD=1 the backward
# runs too, in its deterministic mode and in the fast one, whose dK and dV are compared (its dQ
# sums in arrival order).
#   scripts/gpu-same-bits.sh A_CLI B_CLI OUT          (DEVICE=cpu tries the script here)
# Prints one line per case and exits non-zero if any output differs.
set -euo pipefail
a=${1:?A CLI} b=${2:?B CLI} out=${3:?output folder}
mkdir -p "$out"
tokens=3001 heads=16 heads_kv=2 dim=128  # an awkward length; GQA 8:1
# Random float32 inputs as .npy, without numpy (the CLI rounds them to bf16).
python3 - "$out" "$tokens" "$heads" "$heads_kv" "$dim" <<'EOF'
import array, math, random, struct, sys
out, t, hq, hk, d = sys.argv[1], *map(int, sys.argv[2:])
rng = random.Random(20261204)
def save(name, shape):
    values = array.array("f", (rng.gauss(0.0, 1.0) for _ in range(math.prod(shape))))
    dims = "".join(f"{s}, " for s in shape)
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % dims
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(f"{out}/{name}.npy", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(values.tobytes())
save("q", (t, hq, d)); save("k", (t, hk, d)); save("v", (t, hk, d)); save("dout", (t, hq, d))
save("sink", (hq,))
EOF
cases=("causal" "varlen-causal" "sliding-window --window 700"
  "full --softcap 30 --sink $out/sink.npy")
modes=(forward)
[[ -n ${BACKWARD:-} ]] && modes=(deterministic fast)
rc=0
for c in "${cases[@]}"; do
  for mode in "${modes[@]}"; do
    name=${c%% *}
    [[ $mode != forward ]] && name+=" ($mode)"
    for side in a b; do
      cli=$a
      [[ $side == b ]] && cli=$b
      grads=()
      [[ $mode != forward ]] && grads=(--dout "$out/dout.npy" --dq "$out/$side-dq.npy" --dk
        "$out/$side-dk.npy" --dv "$out/$side-dv.npy")
      [[ $mode == deterministic ]] && grads+=(--deterministic)
      # shellcheck disable=SC2086  # the case's options are a list
      if ! "$cli" attn --device "${DEVICE:-cuda}" --dtype bf16 --mask $c --seqlen "$tokens" \
        --q "$out/q.npy" --k "$out/k.npy" --v "$out/v.npy" --out "$out/$side-out.npy" \
        --lse "$out/$side-lse.npy" "${grads[@]}" > "$out/$side-${name%% *}-$mode.log" 2>&1; then
        echo "$name: $side failed"
        tail -3 "$out/$side-${name%% *}-$mode.log"
        rc=1
      fi
    done
    compared=(out lse dq dk dv)
    [[ $mode == fast ]] && compared=(out lse dk dv)
    same=()
    for t in "${compared[@]}"; do
      [[ -f $out/a-$t.npy ]] || continue
      if cmp -s "$out/a-$t.npy" "$out/b-$t.npy"; then
        same+=("$t=same")
      else
        same+=("$t=DIFFERENT")
        rc=1
      fi
    done
    echo "same-bits $name: ${same[*]}"
    rm -f "$out"/[ab]-*.npy
  done
done
exit $rc
