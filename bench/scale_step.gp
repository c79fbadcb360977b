# Plot for bench/scale_step.sh's table: wall time and peak RSS against chips (log-log). Reads DATAFILE (tab
# separated: chips, wall s, peak RSS MiB; '#' comments), writes OUTFILE (PNG).
#   gnuplot -e "datafile='docs/img/scale_step.tsv'; outfile='docs/img/scale_step.png'" bench/scale_step.gp
set terminal pngcairo size 800,500 noenhanced
set output outfile
set datafile separator "\t"
set logscale xy
set xlabel "chips (one MPI rank, every chip simulated)"
set ylabel "wall time (s) / peak RSS (MiB)"
set title "Llama-3-405B-shaped step, 126 layers, TP8 x PP16 x DP (1F1B), shape-only"
set key top left
set grid
plot datafile using 1:2 with linespoints title "wall (s)", \
     datafile using 1:3 with linespoints title "peak RSS (MiB)", \
     datafile using 1:($2 * 0 + 600) with lines dashtype 2 title "10 min"
