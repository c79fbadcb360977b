# Prefill/decode disaggregation against colocation: Llama-3-70B on two DGX H100 nodes at 8 requests/s, the CDFs of
# TTFT and TPOT over 500 requests (data: disagg_colocated.csv, disagg_disaggregated.csv; see docs/SERVING.md).
#   cd docs/serving && gnuplot disagg.gp
set datafile separator ","
set terminal pngcairo size 1200,440 font ",10"
set output "disagg.png"
set multiplot layout 1,3 title "Llama-3-70B, 2 x 8 H100 (TP8 per node), 8 requests/s, 2048-token prompts (shardsim serve, shape-only)"
set key bottom right
set ylabel "fraction of requests"
set yrange [0:1]
set xlabel "TTFT (ms)"
set title "time to first token"
plot "disagg_colocated.csv" using 1:(1./500) skip 1 smooth cumulative with lines lw 2 title "colocated (2 replicas)", \
     "disagg_disaggregated.csv" using 1:(1./500) skip 1 smooth cumulative with lines lw 2 title "disaggregated (1 prefill + 1 decode)"
set xlabel "TPOT (ms)"
set title "time per output token"
plot "disagg_colocated.csv" using 2:(1./500) skip 1 smooth cumulative with lines lw 2 title "colocated", \
     "disagg_disaggregated.csv" using 2:(1./500) skip 1 smooth cumulative with lines lw 2 title "disaggregated"
set xlabel "end-to-end latency (s)"
set title "end-to-end latency"
plot "disagg_colocated.csv" using 3:(1./500) skip 1 smooth cumulative with lines lw 2 title "colocated", \
     "disagg_disaggregated.csv" using 3:(1./500) skip 1 smooth cumulative with lines lw 2 title "disaggregated"
unset multiplot
