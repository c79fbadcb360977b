# Plot for bench/shape_only_scale.sh: wall time against simulated chips (log-log). Reads DATAFILE (tab
# separated, '#' comments), writes OUTFILE (PNG). Only numbers are read from the data file.
set terminal pngcairo size 800,500 noenhanced
set output outfile
set datafile separator "\t"
set logscale xy
set xlabel "simulated chips (one MPI rank)"
set ylabel "wall time (s)"
set title "1 GiB all_reduce, shape-only, one rank: host wall time"
set key top left
set grid
plot datafile using 1:3 with linespoints title "whole process", \
     datafile using 1:4 with linespoints title "collective only (one call)"
