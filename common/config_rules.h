// Rules between keys of one config section, with messages that name every key involved and where each came from
// (FILE:LINE, or "FILE, --set KEY=V" for a key a command-line override made): a key a --set added next to one it
// excludes is named as the conflict, not reported as an "unknown key" at a line of the config that is fine on its
// own (docs/RELIABILITY.md).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"

namespace shardsim::inline common {

// N's keys of group A and of group B exclude each other (serve.trace: a file, or generated arrivals): when N
// holds one of each, ConfigError at the A key (or at the B key when only that one came from an override), naming
// both keys, where the other came from, and WHY ("a trace is a file or generated arrivals").
void refuse_together(const ConfigNode& n, const std::vector<std::string_view>& a,
                     const std::vector<std::string_view>& b, const std::string& why);

// N's keys outside ALLOWED when its DISCRIMINATOR key (e.g. kind) selects them: ConfigError at the first such
// key, naming it, the discriminator's value and where that came from ("serve.trace.prompt.value (c.yaml:9) is not
// a key of kind uniform (c.yaml, --set serve.trace.prompt.kind=uniform); it takes min, max"). Keys N's
// expect_keys refuses are not checked here.
void refuse_keys_of_other_kinds(const ConfigNode& n, std::string_view discriminator, const std::string& kind,
                                const std::vector<std::string_view>& allowed);

}  // namespace shardsim::common
