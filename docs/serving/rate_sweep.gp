# TTFT and TPOT percentiles of Llama-3-70B TP8 on 8 H100 against the request rate, continuous batching and chunked
# prefill (data: rate_sweep_continuous.csv, rate_sweep_chunked.csv from scripts/serve_sweep.py; see docs/SERVING.md).
#   cd docs/serving && gnuplot rate_sweep.gp
set datafile separator ","
set terminal pngcairo size 1200,480 font ",10"
set output "rate_sweep.png"
set multiplot layout 1,2 title "Llama-3-70B, 8 H100 TP8, 2048-token prompts, 64-512 output tokens (shardsim serve, shape-only)"
set key top left
set xlabel "request rate (requests/s)"
set logscale y
set ylabel "TTFT (ms)"
set title "time to first token"
plot "rate_sweep_continuous.csv" using 1:2 skip 1 with linespoints title "continuous p50", \
     "rate_sweep_continuous.csv" using 1:3 skip 1 with linespoints title "continuous p99", \
     "rate_sweep_chunked.csv" using 1:2 skip 1 with linespoints title "chunked p50", \
     "rate_sweep_chunked.csv" using 1:3 skip 1 with linespoints title "chunked p99"
set ylabel "TPOT (ms)"
set title "time per output token"
plot "rate_sweep_continuous.csv" using 1:4 skip 1 with linespoints title "continuous p50", \
     "rate_sweep_continuous.csv" using 1:5 skip 1 with linespoints title "continuous p99", \
     "rate_sweep_chunked.csv" using 1:4 skip 1 with linespoints title "chunked p50", \
     "rate_sweep_chunked.csv" using 1:5 skip 1 with linespoints title "chunked p99"
unset multiplot
