// send_recv and barrier over real ranks: every algorithm the registry lists for them, checked against the
// single-device reference (tests/mpi/collective_params.h); one dtype each (they move bytes, no arithmetic).
#include "mpi/collective_params.h"

using shardsim::collectives::Collective;

class SendRecvMatrix : public CollectiveTest {};
TEST_P(SendRecvMatrix, MatchesReference) { run_matrix(); }
INSTANTIATE_TEST_SUITE_P(Count, SendRecvMatrix, ::testing::ValuesIn(count_params(Collective::send_recv)), param_name);

class BarrierMatrix : public CollectiveTest {};
TEST_P(BarrierMatrix, Completes) { run_matrix(); }
INSTANTIATE_TEST_SUITE_P(Count, BarrierMatrix, ::testing::ValuesIn(count_params(Collective::barrier, {0})),
                         param_name);
