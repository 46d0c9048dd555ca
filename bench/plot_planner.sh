#!/usr/bin/env bash
# Plots one op of bench/planner's CSV: median time against size per strategy (forced), the
# planner's own runs marked, the predicted crossover drawn; one panel per (transport, agents,
# code, load). Usage: plot_planner.sh planner.csv OP out.png
set -euo pipefail
csv=$1 op=$2 png=$3
command -v gnuplot >/dev/null || { echo "plot_planner.sh: gnuplot not found" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Columns: op,transport,agents,code,load,size,strategy,n,median_us,p99_us,min_us,max_us,mean_us,predicted_us,oracle,chosen,regret,crossover,by_breakpoints
panels=$(tail -n +2 "$csv" | awk -F, -v op="$op" '$1==op {print $2"_"$3"_"$4"_"$5}' | sort -u)
[ -n "$panels" ] || { echo "plot_planner.sh: no rows for op $op in $csv" >&2; exit 1; }
count=$(echo "$panels" | wc -l)
cols=4; rows=$(( (count + cols - 1) / cols ))
{
  echo "set terminal pngcairo size $((cols * 480)),$((rows * 380)) font ',9'"
  echo "set output '$png'"
  echo "set multiplot layout $rows,$cols title '$op: median time against size per strategy; x = the planner, dashed = predicted crossover'"
  echo "set logscale xy; set grid; set key top left font ',8'; set xlabel 'size'; set ylabel 'median (us)'"
  for p in $panels; do
    IFS=_ read -r tl n code load <<<"$p"
    for s in get native xrdma reship planner; do
      awk -F, -v op="$op" -v tl="$tl" -v n="$n" -v c="$code" -v l="$load" -v s="$s" \
        '$1==op && $2==tl && $3==n && $4==c && $5==l && $7==s {print $6, $9, $14}' "$csv" | sort -n >"$tmp/$p.$s"
    done
    x=$(awk -F, -v op="$op" -v tl="$tl" -v n="$n" -v c="$code" -v l="$load" \
        '$1==op && $2==tl && $3==n && $4==c && $5==l && $7=="planner" {print $18; exit}' "$csv")
    echo "unset arrow"
    if [ -n "$x" ] && awk -v x="$x" 'BEGIN{exit !(x > 0)}'; then
      echo "set arrow from $x, graph 0 to $x, graph 1 nohead dt 2 lw 2 lc rgb 'gray40'"
    fi
    echo "set title '$tl, $n agent(s), $code code, $load'"
    # reship: only where the op offers it (a walk over several agents).
    reship=""
    [ -s "$tmp/$p.reship" ] && reship=", '$tmp/$p.reship' u 1:2 w lp lw 2 t 'shipped, back here between agents'"
    echo "plot '$tmp/$p.get' u 1:2 w lp lw 2 t 'get', '$tmp/$p.native' u 1:2 w lp lw 2 t 'native', '$tmp/$p.xrdma' u 1:2 w lp lw 2 t 'shipped'$reship, '$tmp/$p.planner' u 1:2 w p pt 2 ps 2 lw 2 lc rgb 'black' t 'planner'"
  done
  echo "unset multiplot"
} >"$tmp/plot.gp"
gnuplot "$tmp/plot.gp"
