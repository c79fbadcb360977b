#include "collectives/flat.h"

namespace shardsim::collectives::flat {

CollectiveResult finish(runtime::Transport& tp, const std::string& name, const std::string& algorithm,
                        const std::string& explanation, sim::Span span, double bytes, double sent_before) {
  tp.timeline().record_region(name, "collective", span, bytes);
  return {span, tp.bytes_sent() - sent_before, algorithm, explanation};
}

}  // namespace shardsim::collectives::flat
