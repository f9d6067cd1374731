/* SPDX-License-Identifier: MIT */
/* The kvmem command's subcommands: one file each, cmd_<name>.c. */
#ifndef KVMEM_TOOLS_CMD_H
#define KVMEM_TOOLS_CMD_H

int cmd_generate(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_stat(int argc, char **argv);
int cmd_copy(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_lab(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* Benchmarks, dispatched by cmd_bench (bench_<name>.c). */
int bench_select(int argc, char **argv);
int bench_pager(int argc, char **argv);
int bench_recall(int argc, char **argv);
int bench_engine(int argc, char **argv);
int bench_batch(int argc, char **argv);
int bench_step(int argc, char **argv);
/* kvmem bench serve lives with the server (tools/serve/bench_serve.c). */
int bench_serve(int argc, char **argv);
/* kvmem demo --scale N (demo_scale.c): the demo at appliance scale. */
int demo_scale(int argc, char **argv);

/* Exit codes: 0 ok, 1 failure, 2 bad usage. */
#define EXIT_USAGE 2

#endif
