/*
 * Pipeline stages at compile (docs/DESIGN.md, "Pipeline stages"): every
 * node's stage settled and checked on the user's graph, then carried to
 * the per-device program, whose nodes' `stage` says which devices run
 * them.
 */
#ifndef SPMD_COMPILE_STAGES_H
#define SPMD_COMPILE_STAGES_H

#include "compile/compiled.h"

/* With a stage axis on g's mesh: per node of g (the `needed` ones), the
 * stage it runs on, in `stage_of` (-1: every device), written on the
 * node too for the partitioner, which places each node's local nodes
 * there; a leaf's is its home, the stage of its update (only in
 * stage_of).  Refused, naming the nodes: a mark over the stage axis, a
 * stage outside the axis, a node reading values of two stages, a leaf
 * read off its home, collectives in flight. */
spmd_status stages_settle(spmd_graph *g, const bool *needed, bool overlap, int16_t *stage_of);
/* The per-device program's leaves placed at their homes: the stages of
 * their updates. */
void stages_place(compiled *c);
/* The 1F1B schedule's order (docs/DESIGN.md, "Pipeline stages"): per node
 * of the per-device program, the slot its stage runs its micro-batch's
 * forward or backward in (1F1B: S - s - 1 forwards, then one forward and
 * one backward by turns), -1 for a node of no micro-batch (as soon as it
 * can), the update last; *out NULL when no node has a micro-batch.  The
 * plan takes the ready step of the smallest first. */
spmd_status stages_priority(const compiled *c, int64_t **out);

#endif
