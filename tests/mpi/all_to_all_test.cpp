// all_to_all, all_to_allv over real ranks (ctest runs them at np 1, 2, 3, 4 and 8): every algorithm the registry lists for
// them (and auto) x dtypes x ops x counts, checked bit-exactly against the single-device reference,
// special values included (tests/mpi/collective_params.h). A new algorithm is covered by registering it.
#include "mpi/collective_params.h"

using shardsim::collectives::Collective;

class AllToAllMatrix : public CollectiveTest {};
TEST_P(AllToAllMatrix, MatchesReference) { run_matrix(); }
SHARDSIM_REGISTRY_SUITES(AllToAllMatrix, Collective::all_to_all);

class AllToAllvMatrix : public CollectiveTest {};
TEST_P(AllToAllvMatrix, MatchesReference) { run_matrix(); }
SHARDSIM_REGISTRY_SUITES(AllToAllvMatrix, Collective::all_to_allv);
