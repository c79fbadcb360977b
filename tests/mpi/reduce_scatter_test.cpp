// reduce_scatter over real ranks (ctest runs them at np 1, 2, 3, 4 and 8): every algorithm the registry lists for
// it (and auto) x dtypes x ops x counts, checked bit-exactly against the single-device reference,
// special values included (tests/mpi/collective_params.h). A new algorithm is covered by registering it.
#include "mpi/collective_params.h"

using shardsim::collectives::Collective;

class ReduceScatterMatrix : public CollectiveTest {};
TEST_P(ReduceScatterMatrix, MatchesReference) { run_matrix(); }
SHARDSIM_REGISTRY_SUITES(ReduceScatterMatrix, Collective::reduce_scatter);
