/*
 * Reading a column of ops.def whose value is a token rather than a value:
 * whether a row's kernel column names kern_formula, the standard loop
 * over the row's elementwise formula.  Such a row is a plain elementwise
 * op: the runtime makes its kernel from the formula
 * (runtime/kernels_elementwise.c) and spmd_elementwise builds it by name
 * (ir/builders.c).
 *
 * IR_PROBE_kern_formula expands to two tokens while any other kernel's
 * name stays one, so IR_SECOND_ picks 1 for kern_formula and 0 otherwise;
 * IR_WHEN(c, ...) keeps its tokens when c is 1.
 */
#ifndef SPMD_IR_OP_COLUMNS_H
#define SPMD_IR_OP_COLUMNS_H

#define IR_PROBE_kern_formula ~, 1
#define IR_SECOND_(a, b, ...) b
#define IR_IS_FORMULA_KERNEL_(...) IR_SECOND_(__VA_ARGS__, 0, ~)
#define IR_IS_FORMULA_KERNEL(kern) IR_IS_FORMULA_KERNEL_(IR_PROBE_##kern)
#define IR_WHEN(c, ...) IR_WHEN_(c, __VA_ARGS__)
#define IR_WHEN_(c, ...) IR_WHEN_##c(__VA_ARGS__)
#define IR_WHEN_1(...) __VA_ARGS__
#define IR_WHEN_0(...)

#endif
