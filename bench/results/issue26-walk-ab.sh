#!/bin/bash
# A/B: before (f486379^) and after, in place vs raw scatter, 1 and 2 threads
OLD=/work/dec-old/build-old/bench/profile NEW=/work/dec-src/build-dec/bench/profile
D=/work/shared/data S=/work/dec-syn
pairs="$S/step-000:$S/step-001:3 $D/rl-a/step-007:$D/rl-a/step-008:50 $D/rl-a/step-000:$D/rl-a/step-001:50 $D/rl-b/step-000:$D/rl-b/step-001:50 $D/rl-b/step-003:$D/rl-b/step-004:50"
for p in $pairs; do
  IFS=: read a b reps <<< "$p"
  for th in 1 2; do
    for round in 1 2; do
      for which in OLD NEW; do
        bin=${!which}
        echo "## $(basename $(dirname $a))/$(basename $a)->$(basename $b) threads=$th $which round=$round"
        $bin in-place $a.safetensors $b.safetensors --reps $reps --warmup --scatter --threads $th 2>&1 | tail -2
      done
    done
  done
done
