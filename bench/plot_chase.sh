#!/usr/bin/env bash
# Plots pointer_chase's CSV: median latency against depth, one line per strategy, one panel
# per (transport, agents). Usage: plot_chase.sh rows.csv out.png
set -euo pipefail
csv=$1 png=$2
command -v gnuplot >/dev/null || { echo "plot_chase.sh: gnuplot not found" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Columns: transport,agents,strategy,depth,n,median_us,...
panels=$(tail -n +2 "$csv" | awk -F, '$3 != "xrdma_cold" {print $1"_"$2}' | sort -u)
count=$(echo "$panels" | wc -l)
cols=3; rows=$(( (count + cols - 1) / cols ))
{
  echo "set terminal pngcairo size $((cols * 520)),$((rows * 400)) font ',10'"
  echo "set output '$png'"
  echo "set multiplot layout $rows,$cols title 'pointer chase: median latency vs depth (lower is better)'"
  echo "set logscale xy; set grid; set key top left; set xlabel 'depth (hops)'; set ylabel 'median latency (us)'"
  for p in $panels; do
    tl=${p%_*}; n=${p#*_}
    for s in get native xrdma; do
      awk -F, -v tl="$tl" -v n="$n" -v s="$s" '$1==tl && $2==n && $3==s {print $4, $6}' "$csv" >"$tmp/$p.$s"
    done
    echo "set title '$tl, $n agent(s)'"
    echo "plot '$tmp/$p.get' w lp lw 2 t 'RDMA GET per hop', '$tmp/$p.native' w lp lw 2 t 'native handler', '$tmp/$p.xrdma' w lp lw 2 t 'X-RDMA (shipped)'"
  done
  echo "unset multiplot"
} >"$tmp/plot.gp"
gnuplot "$tmp/plot.gp"
