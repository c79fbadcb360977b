// Drawing plots with gnuplot without ever interpreting user text (docs/SECURITY.md): the quoting rules every
// plot script of shardsim uses (sweep plots, profile plots) and the one way gnuplot is started.
//
// - Text that reaches a script (a title) goes through gp_quote: a gnuplot single-quoted string, in which gnuplot
//   performs no backquote command substitution, no @macro expansion and no backslash escapes (scripts set the
//   terminal 'noenhanced'); a quote is doubled, control characters (a newline would end the command) become '?'.
// - Labels (series titles, bar or point labels) are data: written into the .dat file as gp_data_string fields and
//   read back by columnheader / xtic / labels, never spliced into the script.
// - gnuplot runs through posix_spawnp with an argument vector (no /bin/sh), in the plot's directory.
//
// Environment: SHARDSIM_GNUPLOT=PATH runs that gnuplot (default: `gnuplot` on the PATH).
#pragma once

#include <string>
#include <vector>

namespace shardsim::inline common {

std::string gp_quote(const std::string& s);
// One data-file field: in double quotes, with '"' (which a data file cannot escape) as '\'' and control
// characters (which would end the record) as '?'.
std::string gp_data_string(const std::string& s);

// The gnuplot to run: $SHARDSIM_GNUPLOT, else "gnuplot".
std::string gnuplot_program();

// Runs GNUPLOT SCRIPT in DIR with stdin/stdout on /dev/null and stderr to LOG (relative to DIR). Returns the exit
// status, 127 when the program cannot be started (not found; WHY says why), or -1 when it died of a signal.
int run_gnuplot(const std::string& gnuplot, const std::string& dir, const std::string& script, const std::string& log,
                std::string* why);

// Runs every script of SCRIPTS (each "NAME.gp" in DIR, drawing NAME.png) with gnuplot_program(). Returns "" or one
// line saying what went wrong (gnuplot missing: how to install it; a failure: the script and its log). Each drawn
// PNG's path is appended to PNGS; a script's log is removed when it succeeded.
std::string draw_gnuplot_scripts(const std::string& dir, const std::vector<std::string>& scripts,
                                 std::vector<std::string>* pngs);

}  // namespace shardsim::common
