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

#endif
