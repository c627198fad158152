/*
 * Reading a flag's value (flag_values.c): each returns 0, or an exit code
 * after a message naming the flag and what it wants.  `v` is the caller's
 * to give: a reader may cut it, and text fields keep pointing into it.
 */
#ifndef SPMD_TOOLS_FLAG_VALUES_H
#define SPMD_TOOLS_FLAG_VALUES_H

#include "flag_spec.h"
#include "options.h"

/* One flag's value into `o`, by its row's kind. */
int flag_set(const flag_spec *fs, char *v, cli_opts *o);

/* The FLAG_CUSTOM rows' readers. */
int flag_set_model(const flag_spec *fs, char *v, cli_opts *o);     /* gpt|mlp */
int flag_set_optimizer(const flag_spec *fs, char *v, cli_opts *o); /* sgd|adamw|adam|rmsprop|adagrad */
/* --seed, --lr, --warmup or --weight-decay: one value, or one per copy. */
int flag_set_copy_list(const flag_spec *fs, char *v, cli_opts *o);
int flag_set_shard(const flag_spec *fs, char *v, cli_opts *o);  /* PATTERN=SPEC */
int flag_set_prompt(const flag_spec *fs, char *v, cli_opts *o); /* one more row's text */
/* launch's --mca KEY=VALUE and --env NAME[=VALUE]: one more of each. */
int flag_set_launch_list(const flag_spec *fs, char *v, cli_opts *o);

#endif
