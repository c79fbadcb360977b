// Everything the collectives library offers, in one include.
#pragma once

#include "collectives/algorithms.h"
#include "collectives/all_gather.h"
#include "collectives/all_reduce.h"
#include "collectives/all_to_all.h"
#include "collectives/async.h"
#include "collectives/broadcast.h"
#include "collectives/gather.h"
#include "collectives/reduce.h"
#include "collectives/reduce_scatter.h"
#include "collectives/send_recv.h"
#include "collectives/types.h"
