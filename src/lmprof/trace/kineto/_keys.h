/* Generated from src/lmprof/trace/kineto/schema.py by scripts/gen_scan_keys.py: do not edit.
 * tests/test_trace_schema.py checks that this file is what the schema generates. */
#ifndef LMPROF_SCAN_KEYS_H
#define LMPROF_SCAN_KEYS_H

/* the schema this reader was built from (scan.py uses no build made from another) */
#define SCAN_SCHEMA "c1826096f5edd9dc"

/* top-level keys of an event (EVENT_FIELDS), then any other key, then the start of an event */
enum { K_PH, K_NAME, K_CAT, K_PID, K_TID, K_TS, K_DUR, K_ID, K_ARGS, K_OTHER, K_START };
static const char *const KEY_NAMES[K_OTHER] = {"ph", "name", "cat", "pid", "tid", "ts", "dur", "id", "args"};

/* args keys: ID_ARGS (int64 columns), NUMBER_ARGS (float64 columns), SHAPE_ARGS (raw text) */
#define N_ID_ARGS 5
#define N_NUMBER_ARGS 6
#define N_SHAPE_ARGS 2
#define ARG_NUMBER0 N_ID_ARGS
#define ARG_SHAPE0 (N_ID_ARGS + N_NUMBER_ARGS)
#define N_ARG_KEYS (ARG_SHAPE0 + N_SHAPE_ARGS)
#define MAX_ARG_KEY 32
static const char *const ARG_KEYS[N_ARG_KEYS] = {
    "correlation",
    "External id",
    "Sequence number",
    "stream",
    "device",
    "registers per thread",
    "shared memory",
    "blocks per SM",
    "warps per SM",
    "est. achieved occupancy %",
    "bytes",
    "Input Dims",
    "Input type"};

#endif
