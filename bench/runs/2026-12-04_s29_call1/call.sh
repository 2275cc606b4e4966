#!/usr/bin/env bash
# Session 29 call 1: session 28's prepared call as prepared (the run used a copy of it that differed only in its header
# comment): the slot variants' tests, racecheck / synccheck and the A/B at 512 x2 and 8K.
exec bash "$(dirname "$0")/../2026-12-04_s28_prep/frag_slot_call.sh"
