#!/bin/bash
# Session 32's device calls: `bash scripts/results/bench/session32/call.sh ROWS DEADLINE_S CODE VS [BLOCKS_S]`.
# The driver now lives, generalized, in ../session33/call.sh (the same steps; a 6th argument names
# the rows' strategies, optimal-precisionio by default as here, and $BLOCK_MODELS the blocks, all
# three by default as here), so this runs it with session 32's defaults.
exec bash "$(dirname "$0")/../session33/call.sh" "$1" "$2" "$3" "$4" "${5:-0}"
