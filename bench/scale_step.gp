# Plot for bench/scale_step.sh's table: wall time and peak RSS against chips (log-log), folded (the default) and
# with every chip simulated. Reads DATAFILE (tab separated: chips, folded wall s, folded peak RSS MiB, simulated
# step us, unfolded wall s, unfolded peak RSS MiB; '#' comments, NaN where not run), writes OUTFILE (PNG).
#   gnuplot -e "datafile='docs/img/scale_step.tsv'; outfile='docs/img/scale_step.png'" bench/scale_step.gp
set terminal pngcairo size 800,500 noenhanced
set output outfile
set datafile separator "\t"
set datafile missing "NaN"
set logscale xy
set xlabel "chips (one MPI rank)"
set ylabel "wall time (s) / peak RSS (MiB)"
set title "Llama-3-405B-shaped step, 126 layers, TP8 x PP16 x DP (1F1B), shape-only"
set key bottom right
set grid
plot datafile using 1:2 with linespoints title "wall (s), folded (default)", \
     datafile using 1:3 with linespoints title "peak RSS (MiB), folded", \
     datafile using 1:5 with linespoints title "wall (s), every chip (--no-fold)", \
     datafile using 1:6 with linespoints title "peak RSS (MiB), every chip", \
     datafile using 1:($2 * 0 + 600) with lines dashtype 2 title "10 min", \
     datafile using 1:($2 * 0 + 8192) with lines dashtype 3 title "8 GiB"
