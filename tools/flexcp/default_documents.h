// Real document lengths shipped with the tool (no file needed), for packed-document masks.
#pragma once

#include "flexcp/masks.h"

namespace flexcp::tools {

const masks::Lengths& default_document_lengths();

}  // namespace flexcp::tools
