// flexcp: exact attention over ultra-long sequences with arbitrary masks. The one public header.
#pragma once

#include "flexcp/attention.h"
#include "flexcp/attention_plan.h"
#include "flexcp/band.h"
#include "flexcp/comm.h"
#include "flexcp/dist_attention.h"
#include "flexcp/env.h"
#include "flexcp/export.h"
#include "flexcp/mask.h"
#include "flexcp/masks.h"
#include "flexcp/plan.h"
#include "flexcp/status.h"
#include "flexcp/tensor.h"
#include "flexcp/version.h"
