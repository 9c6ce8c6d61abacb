/*
 * lmprof.trace.kineto._scan: a one-pass reader of a JSON list of Kineto / Chrome trace events into columns.
 *
 * Why it exists: decoding every event into a Python object (msgspec) and then reading the objects
 * back into numpy columns costs about 4 CPU seconds for a 259 MB trace; issue 19 asks for the whole
 * analysis in 1 s. This reader writes the columns directly.
 *
 * Why it is safe to trust: it is a *fast path only*. It accepts a list only when every event in it is
 * plain (valid JSON and UTF-8, known fields of the expected JSON types, no \u escapes, integers
 * within int64, finite times, nesting under 64) and then returns exactly what the msgspec path in
 * decode.py computes for it; for anything else it returns None and the caller decodes the list with
 * msgspec as before. So it must be at least as strict as msgspec and never differ where it accepts;
 * tests/test_trace_scan.py compares both paths on real traces and on mutated ones.
 *
 * The keys it knows are generated from the schema (src/lmprof/trace/kineto/schema.py) into _keys.h.
 *
 * scan(buffer) -> None | (n_events, x_columns, flow_columns, x_names, x_cats, flow_phs, flow_cats,
 *                         odd_ids, memory_spans, shape_columns, shape_dims, shape_types)
 *   x_columns    bytearrays, one row per "ph": "X" event in file order: name, cat (int32 codes into
 *                x_names / x_cats), pid, tid (int64), ts, dur (float64), one per ID_ARGS field of
 *                schema.py (int64, -1 when absent or null: correlation, External id, ...), one per
 *                NUMBER_ARGS field (float64, NaN when absent or null: registers per thread, ...),
 *                args offset and length in the buffer (int64, -1 when the event has no args object)
 *   flow_columns 6 bytearrays, one row per flow event (ph s/t/f): id (int64), ph, cat (int32 codes),
 *                pid, tid (int64), ts (float64)
 *   x_names ...  the distinct raw strings (bytes between the quotes, escapes kept) in code order
 *   odd_ids      (column, row, raw) for id fields written as strings; their cell holds 0 and the
 *                caller applies decode.py's rules (column numbers: see ODD_* below)
 *   memory_spans (offset, length) of each "[memory]" instant event ("ph" i or I)
 *   shape_columns 3 bytearrays, one row per "ph": "X" event whose args has an "Input Dims" that is
 *                not null (record_shapes): its X row (int64), the code of its "Input Dims" value in
 *                shape_dims and of its "Input type" value in shape_types (int32, -1 when absent or
 *                null)
 *   shape_dims, shape_types  the distinct raw values (the JSON text of each, validated) in code order
 *                The caller decodes each distinct value once, not each operator's: equal shapes
 *                repeat from layer to layer and step to step, and decoding every operator's shapes
 *                in Python took more than half of loading a record_shapes trace (issue 46).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_keys.h"

#if N_SHAPE_ARGS != 2
#error "the reader keeps one operator's shapes as two raw values: \"Input Dims\" and \"Input type\""
#endif
#if N_ARG_KEYS > 32 || K_START >= 16
#error "more keys than the reader's bit sets and tables hold"
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && (defined(__GNUC__) || defined(__clang__))
/* p[0] is a loaded word's lowest byte (the first special byte of a word is at ctz / 8), and words
 * are read whole where the bytes allow */
#define LITTLE_ENDIAN_CTZ 1
#endif

#define MAX_DEPTH 64
#define OK 0
#define REFUSE 1  /* not the fast path's input: the caller decodes it with msgspec */
#define NOMEM -1

/* odd_ids column numbers: pid, tid, then one per ID_ARGS field, then the flow events' id, pid, tid */
enum { ODD_PID, ODD_TID, ODD_ARG0, ODD_FL_ID = ODD_ARG0 + N_ID_ARGS, ODD_FL_PID, ODD_FL_TID };

/* ------------------------------------------------------------------------------ growable buffers */

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int buf_grow(Buf *b, size_t n) {
    {
        size_t cap = b->cap ? b->cap * 2 : 1 << 14;
        while (cap < b->len + n) cap *= 2;
        char *p = (char *)realloc(b->data, cap);
        if (!p) return NOMEM;
        b->data = p;
        b->cap = cap;
    }
    return OK;
}

static inline int buf_put(Buf *b, const void *v, size_t n) {
    if (b->len + n > b->cap && buf_grow(b, n) != OK) return NOMEM;
    memcpy(b->data + b->len, v, n);
    b->len += n;
    return OK;
}

#define PUT(b, T, v)                                                               \
    do {                                                                           \
        if ((b).len + sizeof(T) > (b).cap && buf_grow(&(b), sizeof(T)) != OK) return NOMEM; \
        T tmp_ = (v);                                                              \
        memcpy((b).data + (b).len, &tmp_, sizeof(T));                              \
        (b).len += sizeof(T);                                                      \
    } while (0)

/* --------------------------------------------------------------------- interned raw strings */

typedef struct {
    int32_t *slots; /* entry index + 1; 0 = empty */
    size_t cap;     /* power of two */
    Buf off, len, hash; /* per entry, in code order: Py_ssize_t, Py_ssize_t, uint64_t */
    size_t n;
} Table;

/* ``end``: where the readable bytes stop (a last word may be read whole below it). */
static uint64_t hash_bytes(const uint8_t *s, size_t n, const uint8_t *end) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
#ifdef LITTLE_ENDIAN_CTZ
    /* a whole word, masked: copying the n bytes into a word stalled the load that read it back */
    if (n && end - s >= 8) {
        memcpy(&w, s, 8);
        w &= (1ull << (8 * n)) - 1;
    } else
#endif
        for (size_t i = 0; i < n; i++) w |= (uint64_t)s[i] << (8 * i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return h;
}

static int table_grow(Table *t) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    int32_t *slots = (int32_t *)calloc(cap, sizeof(int32_t));
    if (!slots) return NOMEM;
    const uint64_t *hs = (const uint64_t *)t->hash.data;
    for (size_t e = 0; e < t->n; e++) {
        size_t i = hs[e] & (cap - 1);
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = (int32_t)(e + 1);
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return OK;
}

/* the code of base[off:off+n] in t (a new one when unseen), or -1 when out of memory */
static int32_t intern(Table *t, const uint8_t *base, const uint8_t *end, Py_ssize_t off, Py_ssize_t n) {
    if ((t->n + 1) * 2 > t->cap && table_grow(t) != OK) return -1;
    uint64_t h = hash_bytes(base + off, (size_t)n, end);
    const uint64_t *hs = (const uint64_t *)t->hash.data;
    const Py_ssize_t *offs = (const Py_ssize_t *)t->off.data, *lens = (const Py_ssize_t *)t->len.data;
    size_t i = h & (t->cap - 1);
    while (t->slots[i]) {
        size_t e = (size_t)t->slots[i] - 1;
        if (hs[e] == h && lens[e] == n && memcmp(base + offs[e], base + off, (size_t)n) == 0) return (int32_t)e;
        i = (i + 1) & (t->cap - 1);
    }
    if (t->n >= INT32_MAX - 1) return -1;
    if (buf_put(&t->off, &off, sizeof off) || buf_put(&t->len, &n, sizeof n) || buf_put(&t->hash, &h, sizeof h))
        return -1;
    t->slots[i] = (int32_t)(t->n + 1);
    return (int32_t)t->n++;
}

static void table_free(Table *t) {
    free(t->slots);
    free(t->off.data);
    free(t->len.data);
    free(t->hash.data);
}

/* ------------------------------------------------------------------------------------- scanner */

enum { X_NAME, X_CAT, X_PID, X_TID, X_TS, X_DUR, X_ARG0, X_HW = X_ARG0 + N_ID_ARGS, X_ARGS_OFF = X_HW + N_NUMBER_ARGS,
       X_ARGS_LEN, N_X };
enum { F_ID, F_PH, F_CAT, F_PID, F_TID, F_TS };

typedef struct {
    const uint8_t *base, *p, *end;
    Py_ssize_t n_events;
    Buf x[N_X];
    Buf fl[6];
    Table names, xcats, phs, flcats, dims, types;
    Buf shape[3]; /* per X row with shapes: row (int64), dims code, types code (int32) */
    Buf odd; /* int32 column, int64 row, Py_ssize_t offset, Py_ssize_t length */
    Buf mem; /* Py_ssize_t offset, Py_ssize_t length */
    int8_t next_key[16]; /* by event key (K_START first): the known key that followed it last, or -1 */
} Scanner;


static inline void skip_ws(Scanner *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

/* The high bit of each byte of w that is a quote, a backslash, a control or a non-ASCII byte: the
 * classic has-zero-byte test on w^'"' and w^'\\', has-less-than-0x20, and the high bits. A borrow
 * only runs upwards, so the lowest flagged byte is always a true one (bytes above it may be false). */
static inline uint64_t special8(uint64_t w) {
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
    return (((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w) | w) & high;
}


/* A string at s->p (which is '"'): its raw body as [*off, *off + *n); *esc when it holds escapes.
 * Refuses control characters, \u escapes and invalid UTF-8 (Python's strict rules). */
static int read_string(Scanner *s, Py_ssize_t *off, Py_ssize_t *n, int *esc) {
    const uint8_t *p = s->p + 1, *end = s->end;
    *esc = 0;
    for (;;) {
        /* eight bytes at a time while none is a quote, a backslash, a control or a non-ASCII byte */
        while (end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            uint64_t m = special8(w);
            if (m) {
#ifdef LITTLE_ENDIAN_CTZ
                p += __builtin_ctzll(m) >> 3; /* straight to it: most strings are short keys */
#endif
                break;
            }
            p += 8;
        }
        while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
        if (p >= end) return REFUSE;
        uint8_t c = *p;
        if (c == '"') break;
        if (c == '\\') {
            if (p + 1 >= end) return REFUSE;
            uint8_t e = p[1];
            if (!(e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't'))
                return REFUSE; /* \u (and anything invalid): msgspec decides */
            *esc = 1;
            p += 2;
            continue;
        }
        if (c < 0x20) return REFUSE;
        /* UTF-8 sequence, validated as Python's strict decoder does */
        int k;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else return REFUSE;
        if (end - p <= k) return REFUSE;
        if (p[1] < lo || p[1] > hi) return REFUSE;
        for (int j = 2; j <= k; j++)
            if (p[j] < 0x80 || p[j] > 0xBF) return REFUSE;
        p += k + 1;
    }
    *off = (s->p + 1) - s->base;
    *n = p - (s->p + 1);
    s->p = p + 1;
    return OK;
}

typedef struct {
    int is_int, neg, many; /* many: more than 19 significant digits */
    uint64_t mant;         /* significant digits, leading zeros dropped */
    int exp10;             /* value = mant * 10^exp10 (when !many) */
    const uint8_t *start, *stop;
} Number;

#ifdef LITTLE_ENDIAN_CTZ
/* Eight ASCII digits in one word, and their value (p[0] most significant): the well-known SWAR
 * conversion (three multiplies instead of eight dependent steps). Timestamps have 16 or more digits. */
static inline int eight_digits(uint64_t w) {
    return (((w + 0x4646464646464646ull) | (w - 0x3030303030303030ull)) & 0x8080808080808080ull) == 0;
}

static inline uint64_t eight_digits_value(uint64_t w) {
    w -= 0x3030303030303030ull;
    w = w * 10 + (w >> 8); /* pairs of digits */
    return (((w & 0x000000FF000000FFull) * (100 + (1000000ull << 32))) +
            (((w >> 16) & 0x000000FF000000FFull) * (1 + (10000ull << 32)))) >> 32;
}
#endif

/* A JSON number at s->p, by the grammar -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int read_number(Scanner *s, Number *num) {
    const uint8_t *p = s->p, *end = s->end;
    num->start = p;
    num->neg = 0;
    num->is_int = 1;
    num->many = 0;
    num->mant = 0;
    num->exp10 = 0;
    int digits = 0;
    if (p < end && *p == '-') {
        num->neg = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9') return REFUSE;
    if (*p == '0') {
        p++;
    } else {
#ifdef LITTLE_ENDIAN_CTZ
        while (digits <= 11 && end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if (!eight_digits(w)) break;
            num->mant = num->mant * 100000000ull + eight_digits_value(w);
            digits += 8;
            p += 8;
        }
#endif
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits < 19) {
                num->mant = num->mant * 10 + (uint64_t)(*p - '0');
                digits++;
            } else {
                num->many = 1;
            }
            p++;
        }
    }
    if (p < end && *p == '.') {
        num->is_int = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return REFUSE;
#ifdef LITTLE_ENDIAN_CTZ
        while (num->mant != 0 && digits <= 11 && end - p >= 8) { /* leading zeros: the loop below */
            uint64_t w;
            memcpy(&w, p, 8);
            if (!eight_digits(w)) break;
            num->mant = num->mant * 100000000ull + eight_digits_value(w);
            num->exp10 -= 8;
            digits += 8;
            p += 8;
        }
#endif
        while (p < end && *p >= '0' && *p <= '9') {
            if (num->mant == 0 && *p == '0') {
                num->exp10--; /* leading zeros of a fraction are not significant */
            } else if (digits < 19) {
                num->mant = num->mant * 10 + (uint64_t)(*p - '0');
                num->exp10--;
                digits++;
            } else {
                num->many = 1;
            }
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        num->is_int = 0;
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) eneg = *p++ == '-';
        if (p >= end || *p < '0' || *p > '9') return REFUSE;
        int e = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (e < 100000) e = e * 10 + (*p - '0');
            p++;
        }
        num->exp10 += eneg ? -e : e;
    }
    num->stop = p;
    s->p = p;
    return OK;
}

/* An int64 from a number token, or REFUSE (fractions, exponents, out of range: msgspec decides). */
static int number_int64(const Number *num, int64_t *out) {
    if (!num->is_int || num->many) return REFUSE;
    if (num->neg) {
        if (num->mant > (uint64_t)INT64_MAX + 1) return REFUSE;
        *out = (int64_t)(0 - num->mant);
    } else {
        if (num->mant > (uint64_t)INT64_MAX) return REFUSE;
        *out = (int64_t)num->mant;
    }
    return OK;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The correctly rounded double of a number token (what msgspec and Python's float() give). */
static int number_double(const Number *num, double *out) {
    if (!num->many && num->mant <= (1ull << 53) && num->exp10 >= -22 && num->exp10 <= 22) {
        /* both operands exact: one IEEE operation rounds correctly (Clinger's fast path) */
        double m = (double)num->mant;
        double v = num->exp10 >= 0 ? m * POW10[num->exp10] : m / POW10[-num->exp10];
        *out = num->neg ? -v : v;
        return OK;
    }
#if LDBL_MANT_DIG >= 64
    if (!num->many && num->exp10 >= -27 && num->exp10 <= 27) {
        /* 19 digits and 10^27 are exact in a 64-bit-mantissa long double, so one long double operation
         * rounds once; rounding that to double is then correct unless it landed exactly on a midpoint
         * between two doubles (double rounding), which goes to the exact parser below. */
        long double m = (long double)num->mant, p10 = 1.0L;
        int e = num->exp10 >= 0 ? num->exp10 : -num->exp10;
        for (int i = 0; i < e; i++) p10 *= 10.0L;
        long double q = num->exp10 >= 0 ? m * p10 : m / p10;
        double d = (double)q;
        long double diff = q - (long double)d;
        if (diff != 0 && isfinite(d) && d != 0) {
            long double up = (long double)nextafter(d, INFINITY) - (long double)d;
            long double down = (long double)d - (long double)nextafter(d, -INFINITY);
            if (diff == up / 2 || -diff == down / 2) goto exact;
        }
        *out = num->neg ? -d : d;
        return OK;
    }
exact:
#endif
    {
        char tmp[128];
        Py_ssize_t n = num->stop - num->start;
        if (n >= (Py_ssize_t)sizeof tmp) return REFUSE;
        memcpy(tmp, num->start, (size_t)n);
        tmp[n] = 0;
        /* Python's own correctly rounded, locale-independent parser; scan() runs without the GIL */
        PyGILState_STATE gil = PyGILState_Ensure();
        double v = PyOS_string_to_double(tmp, NULL, NULL);
        int failed = v == -1.0 && PyErr_Occurred();
        if (failed) PyErr_Clear();
        PyGILState_Release(gil);
        if (failed) return REFUSE;
        *out = v;
        return OK;
    }
}

static int skip_value(Scanner *s, int depth);

/* Past an opening bracket and the space after it: 1 when its ``close`` follows at once (an empty
 * object or list, skipped too), else 0 with the reader at the first member. */
static inline int opens_empty(Scanner *s, uint8_t close) {
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return 1;
    }
    return 0;
}

#define MORE 2 /* after_member: another member follows */

/* After a member or item: MORE when a comma follows (skipped, and the space after it), OK when the
 * closing bracket does (skipped), REFUSE for anything else. */
static int after_member(Scanner *s, uint8_t close) {
    skip_ws(s);
    if (s->p >= s->end) return REFUSE;
    if (*s->p == ',') {
        s->p++;
        skip_ws(s);
        return MORE;
    }
    if (*s->p == close) {
        s->p++;
        return OK;
    }
    return REFUSE;
}

/* The colon after a key, and the space around it. */
static int after_key(Scanner *s) {
    skip_ws(s);
    if (s->p >= s->end || *s->p != ':') return REFUSE;
    s->p++;
    skip_ws(s);
    return s->p < s->end ? OK : REFUSE;
}

/* An object key and its colon: the key's raw body; keys with escapes are refused (msgspec decides). */
static int read_key(Scanner *s, Py_ssize_t *off, Py_ssize_t *n) {
    int esc, r;
    if (s->p >= s->end || *s->p != '"') return REFUSE;
    if ((r = read_string(s, off, n, &esc)) != OK) return r;
    if (esc) return REFUSE;
    return after_key(s);
}

static int expect_literal(Scanner *s, const char *lit, size_t n) {
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n) != 0) return REFUSE;
    s->p += n;
    return OK;
}

/* Any JSON value, validated and skipped. */
static int skip_value(Scanner *s, int depth) {
    if (depth > MAX_DEPTH || s->p >= s->end) return REFUSE;
    Py_ssize_t off, n;
    int esc, r;
    switch (*s->p) {
    case '"':
        return read_string(s, &off, &n, &esc);
    case '{':
    case '[': {
        uint8_t close = *s->p == '{' ? '}' : ']';
        int obj = close == '}';
        if (opens_empty(s, close)) return OK;
        for (;;) {
            if (obj && (r = read_key(s, &off, &n)) != OK) return r;
            if ((r = skip_value(s, depth + 1)) != OK) return r;
            if ((r = after_member(s, close)) != MORE) return r;
        }
    }
    case 't':
        return expect_literal(s, "true", 4);
    case 'f':
        return expect_literal(s, "false", 5);
    case 'n':
        return expect_literal(s, "null", 4);
    default: {
        Number num;
        if ((r = read_number(s, &num)) != OK) return r;
        /* msgspec decodes these values (as Any): keep to numbers it surely reads the same way */
        if (num.many || num.exp10 > 300 || num.exp10 < -300) return REFUSE;
        return OK;
    }
    }
}

static int is_null(Scanner *s) {
    if (s->end - s->p >= 4 && memcmp(s->p, "null", 4) == 0) {
        s->p += 4;
        return 1;
    }
    return 0;
}

/* An id field as read: its int64 value, or (is_text) where its text stands and 0 as the value. */
typedef struct {
    int64_t v;
    int is_text;
    Py_ssize_t toff, tn;
} Id;

/* An id field (int | str | None): int64 value, null -> none, text -> an odd entry (cell 0). */
static int read_id(Scanner *s, Id *out, int64_t none) {
    out->is_text = 0;
    if (s->p >= s->end) return REFUSE;
    if (*s->p == '"') {
        int esc;
        int r = read_string(s, &out->toff, &out->tn, &esc);
        if (r != OK) return r;
        out->is_text = 1;
        out->v = 0;
        return OK;
    }
    if (is_null(s)) {
        out->v = none;
        return OK;
    }
    if (*s->p != '-' && (*s->p < '0' || *s->p > '9')) return REFUSE; /* bools, objects: msgspec decides */
    Number num;
    int r = read_number(s, &num);
    if (r != OK) return r;
    return number_int64(&num, &out->v);
}

/* A number field: its finite double, null -> if_null; text, bools and the rest are refused. Times
 * (float | str | None, null read as 0.0) and kernel resources (null read as absent, NaN). */
static int read_double(Scanner *s, double *out, double if_null) {
    if (s->p >= s->end) return REFUSE;
    if (is_null(s)) {
        *out = if_null;
        return OK;
    }
    if (*s->p != '-' && (*s->p < '0' || *s->p > '9')) return REFUSE;
    Number num;
    int r = read_number(s, &num);
    if (r != OK) return r;
    if ((r = number_double(&num, out)) != OK) return r;
    return isfinite(*out) ? OK : REFUSE;
}

/* One event's known args (ARG_KEYS of _keys.h): the id args (int | str | None), what CUPTI reports
 * per kernel and copy (numbers or null), and an operator's input shapes and dtypes (record_shapes:
 * any JSON, kept as raw text). */
typedef struct {
    Id ids[N_ID_ARGS];
    double hw[N_NUMBER_ARGS];
    Py_ssize_t voff[N_SHAPE_ARGS], vn[N_SHAPE_ARGS]; /* the raw value; vn -1 when absent or null */
} Args;

/* By a key's length and last byte, the one ARG_KEYS entry it can be, plus one; 0 for none. No two of
 * them share both ("Input Dims" and "Input type" share their length and first byte; the schema's
 * generator refuses a table where two would), so a key is compared with at most one candidate. */
static int8_t ARG_BY_LEN_LAST[MAX_ARG_KEY][256];

static int arg_keys_init(void) {
    for (int k = 0; k < N_ARG_KEYS; k++) {
        size_t n = strlen(ARG_KEYS[k]);
        if (n == 0 || n >= MAX_ARG_KEY) return -1;
        int8_t *slot = &ARG_BY_LEN_LAST[n][(uint8_t)ARG_KEYS[k][n - 1]];
        if (*slot) return -1; /* two keys alike in both: the table cannot tell them apart */
        *slot = (int8_t)(k + 1);
    }
    return 0;
}

/* The ARG_KEYS index of a raw key, or -1 for any other key. */
static int arg_of(const uint8_t *k, Py_ssize_t n) {
    if (n <= 0 || n >= MAX_ARG_KEY) return -1;
    int c = ARG_BY_LEN_LAST[n][k[n - 1]] - 1;
    if (c < 0) return -1;
    return memcmp(k, ARG_KEYS[c], (size_t)n) == 0 ? c : -1;
}

static void args_init(Args *a) {
    for (int k = 0; k < N_ID_ARGS; k++) {
        a->ids[k].v = -1;
        a->ids[k].is_text = 0;
    }
    for (int k = 0; k < N_NUMBER_ARGS; k++) a->hw[k] = NAN;
    for (int k = 0; k < N_SHAPE_ARGS; k++) a->vn[k] = -1;
}

static int read_args(Scanner *s, Args *a) {
    unsigned seen = 0;
    args_init(a);
    if (opens_empty(s, '}')) return OK;
    for (;;) {
        Py_ssize_t off, n;
        int r;
        if ((r = read_key(s, &off, &n)) != OK) return r;
        int which = arg_of(s->base + off, n);
        if (which >= 0) {
            if (seen & (1u << which)) return REFUSE; /* duplicate key */
            seen |= 1u << which;
        }
        if (which < 0) {
            r = skip_value(s, 2);
        } else if (which < ARG_NUMBER0) {
            r = read_id(s, &a->ids[which], -1);
        } else if (which < ARG_SHAPE0) {
            /* text is absent, as msgspec's reading has it: ROCm's runtime copy calls write "bytes": "9216",
             * and refusing it sent every chunk of such a trace to the slow reader */
            r = s->p < s->end && *s->p == '"' ? skip_value(s, 2) : read_double(s, &a->hw[which - ARG_NUMBER0], NAN);
        } else if (is_null(s)) {
            r = OK; /* as absent */
        } else {
            const uint8_t *v0 = s->p;
            r = skip_value(s, 2);
            a->voff[which - ARG_SHAPE0] = v0 - s->base;
            a->vn[which - ARG_SHAPE0] = s->p - v0;
        }
        if (r != OK) return r;
        if ((r = after_member(s, '}')) != MORE) return r;
    }
}

/* Each known key (KEY_NAMES of _keys.h) quoted ("ph"), as the low bytes of a word: a key is taken
 * whole when the bytes at the reader match it, which also proves it plain (ASCII, no escape), as
 * read_string would find. */
static uint64_t KEY_WORD[K_OTHER], KEY_MASK[K_OTHER];
static int KEY_LEN[K_OTHER];

static void key_words_init(void) {
    for (int k = 0; k < K_OTHER; k++) {
        uint8_t w[8] = {0};
        size_t n = strlen(KEY_NAMES[k]) + 2; /* at most 8 (the schema's generator checks) */
        w[0] = '"';
        memcpy(w + 1, KEY_NAMES[k], n - 2);
        w[n - 1] = '"';
        memcpy(&KEY_WORD[k], w, 8);
        KEY_MASK[k] = n == 8 ? ~0ull : (1ull << (8 * n)) - 1;
        KEY_LEN[k] = (int)n;
    }
}

/* The K_* of a raw key (K_OTHER for any other): rarely asked, next_key takes most keys whole. */
static int key_of(const uint8_t *k, Py_ssize_t n) {
    for (int key = 0; key < K_OTHER; key++)
        if (KEY_LEN[key] == n + 2 && memcmp(k, KEY_NAMES[key], (size_t)n) == 0) return key;
    return K_OTHER;
}

/* The next member's key, as K_*: first tried as the key that followed the previous one last time
 * (Kineto writes every event's keys in one order, so this is nearly always it: one word compared
 * instead of a string read and a lookup), else read and looked up. */
static int next_key(Scanner *s, int prev) {
#ifdef LITTLE_ENDIAN_CTZ
    int g = s->next_key[prev];
    if (g >= 0 && s->end - s->p >= 8) {
        uint64_t w;
        memcpy(&w, s->p, 8);
        if ((w & KEY_MASK[g]) == KEY_WORD[g]) {
            const uint8_t *q = s->p + KEY_LEN[g];
            /* and the usual ": " with the value right after it (bytes up to ' ' are space or invalid) */
            if (q[0] == ':' && q + 2 < s->end && q[1] == ' ' && q[2] > ' ') {
                s->p = q + 2;
                return g;
            }
            s->p = q;
            return after_key(s) == OK ? g : -1;
        }
    }
#endif
    Py_ssize_t koff, kn;
    if (read_key(s, &koff, &kn) != OK) return -1;
    int key = key_of(s->base + koff, kn);
    s->next_key[prev] = (int8_t)(key == K_OTHER ? -1 : key);
    return key;
}

static int put_odd(Scanner *s, int32_t col, int64_t row, Py_ssize_t off, Py_ssize_t n) {
    PUT(s->odd, int32_t, col);
    PUT(s->odd, int64_t, row);
    PUT(s->odd, Py_ssize_t, off);
    PUT(s->odd, Py_ssize_t, n);
    return OK;
}

/* An id into its column, and one read as text into the odd entries too (column ``odd``, row ``row``). */
static inline int put_id(Scanner *s, Buf *col, const Id *id, int32_t odd, int64_t row) {
    PUT(*col, int64_t, id->v);
    return id->is_text ? put_odd(s, odd, row, id->toff, id->tn) : OK;
}

static int read_event(Scanner *s) {
    const uint8_t *start = s->p;
    unsigned seen = 0;
    Py_ssize_t ph_off = 0, ph_n = 0, name_off = 0, name_n = 0, cat_off = 0, cat_n = 0;
    Py_ssize_t args_off = -1, args_n = -1;
    int esc, r;
    Id pid = {0, 0, 0, 0}, tid = {0, 0, 0, 0}, id = {-1, 0, 0, 0};
    double ts = 0.0, dur = 0.0;
    Args args;
    args_init(&args);
    if (!opens_empty(s, '}')) {
        int prev = K_START;
        for (;;) {
            int key = next_key(s, prev);
            if (key < 0) return REFUSE;
            prev = key;
            if (key != K_OTHER) {
                if (seen & (1u << key)) return REFUSE; /* duplicate key: msgspec decides */
                seen |= 1u << key;
            }
            switch (key) {
            case K_PH:
            case K_NAME:
            case K_CAT: {
                Py_ssize_t off, n;
                if (*s->p != '"') return REFUSE; /* null / numbers as names: msgspec decides */
                if ((r = read_string(s, &off, &n, &esc)) != OK) return r;
                if (key == K_PH) {
                    if (esc) return REFUSE;
                    ph_off = off;
                    ph_n = n;
                } else if (key == K_NAME) {
                    name_off = off;
                    name_n = n;
                } else {
                    cat_off = off;
                    cat_n = n;
                }
                break;
            }
            case K_PID:
            case K_TID:
            case K_ID: /* a null id reads as -1 (none), a null pid or tid as 0 */
                r = read_id(s, key == K_PID ? &pid : key == K_TID ? &tid : &id, key == K_ID ? -1 : 0);
                break;
            case K_TS:
            case K_DUR:
                r = read_double(s, key == K_TS ? &ts : &dur, 0.0);
                break;
            case K_ARGS:
                if (is_null(s)) {
                    r = OK;
                } else if (*s->p == '{') {
                    const uint8_t *a0 = s->p;
                    r = read_args(s, &args);
                    args_off = a0 - s->base;
                    args_n = s->p - a0;
                } else {
                    r = REFUSE;
                }
                break;
            default:
                r = skip_value(s, 2);
            }
            if (r != OK) return r;
            if ((r = after_member(s, '}')) == MORE) continue;
            if (r != OK) return r;
            break;
        }
    }
    s->n_events++;
    const uint8_t *ph = s->base + ph_off;
    if (ph_n == 1 && ph[0] == 'X') {
        int64_t row = (int64_t)(s->x[X_PID].len / sizeof(int64_t));
        int32_t nc = intern(&s->names, s->base, s->end, name_off, name_n);
        int32_t cc = intern(&s->xcats, s->base, s->end, cat_off, cat_n);
        if (nc < 0 || cc < 0) return NOMEM;
        PUT(s->x[X_NAME], int32_t, nc);
        PUT(s->x[X_CAT], int32_t, cc);
        if (put_id(s, &s->x[X_PID], &pid, ODD_PID, row) != OK) return NOMEM;
        if (put_id(s, &s->x[X_TID], &tid, ODD_TID, row) != OK) return NOMEM;
        PUT(s->x[X_TS], double, ts);
        PUT(s->x[X_DUR], double, dur);
        for (int k = 0; k < N_ID_ARGS; k++) {
            if (put_id(s, &s->x[X_ARG0 + k], &args.ids[k], ODD_ARG0 + k, row) != OK) return NOMEM;
        }
        for (int k = 0; k < N_NUMBER_ARGS; k++) PUT(s->x[X_HW + k], double, args.hw[k]);
        PUT(s->x[X_ARGS_OFF], int64_t, (int64_t)args_off);
        PUT(s->x[X_ARGS_LEN], int64_t, (int64_t)args_n);
        if (args.vn[0] >= 0) {
            int32_t dc = intern(&s->dims, s->base, s->end, args.voff[0], args.vn[0]);
            int32_t tc = args.vn[1] >= 0 ? intern(&s->types, s->base, s->end, args.voff[1], args.vn[1]) : 0;
            if (dc < 0 || tc < 0) return NOMEM;
            PUT(s->shape[0], int64_t, row);
            PUT(s->shape[1], int32_t, dc);
            PUT(s->shape[2], int32_t, args.vn[1] >= 0 ? tc : -1);
        }
    } else if (ph_n == 1 && (ph[0] == 's' || ph[0] == 't' || ph[0] == 'f')) {
        int64_t row = (int64_t)(s->fl[F_ID].len / sizeof(int64_t));
        int32_t pc = intern(&s->phs, s->base, s->end, ph_off, ph_n);
        int32_t cc = intern(&s->flcats, s->base, s->end, cat_off, cat_n);
        if (pc < 0 || cc < 0) return NOMEM;
        if (put_id(s, &s->fl[F_ID], &id, ODD_FL_ID, row) != OK) return NOMEM;
        PUT(s->fl[F_PH], int32_t, pc);
        PUT(s->fl[F_CAT], int32_t, cc);
        if (put_id(s, &s->fl[F_PID], &pid, ODD_FL_PID, row) != OK) return NOMEM;
        if (put_id(s, &s->fl[F_TID], &tid, ODD_FL_TID, row) != OK) return NOMEM;
        PUT(s->fl[F_TS], double, ts);
    } else if (ph_n == 1 && (ph[0] == 'i' || ph[0] == 'I') && name_n == 8 &&
               memcmp(s->base + name_off, "[memory]", 8) == 0) {
        PUT(s->mem, Py_ssize_t, start - s->base);
        PUT(s->mem, Py_ssize_t, s->p - start);
    }
    return OK;
}

static int scan_list(Scanner *s) {
    skip_ws(s);
    if (s->p >= s->end || *s->p != '[') return REFUSE;
    if (!opens_empty(s, ']')) {
        for (;;) {
            if (s->p >= s->end || *s->p != '{') return REFUSE; /* non-object items: msgspec decides */
            int r = read_event(s);
            if (r != OK) return r;
            if ((r = after_member(s, ']')) == MORE) continue;
            if (r != OK) return r;
            break;
        }
    }
    skip_ws(s);
    return s->p == s->end ? OK : REFUSE;
}

/* ------------------------------------------------------------------------------ Python objects */

static PyObject *bytes_list(const Table *t, const uint8_t *base) {
    PyObject *out = PyList_New((Py_ssize_t)t->n);
    if (!out) return NULL;
    const Py_ssize_t *offs = (const Py_ssize_t *)t->off.data, *lens = (const Py_ssize_t *)t->len.data;
    for (size_t e = 0; e < t->n; e++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)base + offs[e], lens[e]);
        if (!b) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)e, b);
    }
    return out;
}

/* A column's bytes, handed to Python as they are: the object owns the scanner's buffer and exports
 * it through the buffer protocol (numpy.frombuffer reads it in place). Copying each column into a
 * bytearray instead copied ~140 MB of a 259 MB trace while holding the GIL, and faulted in as much
 * fresh memory. */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len;
} Column;

static int column_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Column *c = (Column *)self;
    static char empty[1];
    return PyBuffer_FillInfo(view, self, c->data ? c->data : empty, c->len, 0, flags);
}

static void column_dealloc(PyObject *self) {
    free(((Column *)self)->data);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs column_as_buffer = {column_getbuffer, NULL};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lmprof.trace.kineto._scan.Column",
    .tp_doc = "One scanned column's bytes (buffer protocol).",
    .tp_basicsize = sizeof(Column),
    .tp_dealloc = column_dealloc,
    .tp_as_buffer = &column_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

/* The buffers become Column objects; each one taken is cleared from ``bufs`` (scanner_free skips it). */
static PyObject *columns(Buf *bufs, int n) {
    PyObject *out = PyTuple_New(n);
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        Column *c = PyObject_New(Column, &ColumnType);
        if (!c) {
            Py_DECREF(out);
            return NULL;
        }
        c->data = bufs[i].data;
        c->len = (Py_ssize_t)bufs[i].len;
        if (c->data && bufs[i].cap > bufs[i].len && bufs[i].len > 0) {
            char *shrunk = realloc(c->data, bufs[i].len); /* give the growth slack back (in place) */
            if (shrunk) c->data = shrunk;
        }
        bufs[i].data = NULL;
        bufs[i].len = bufs[i].cap = 0;
        PyTuple_SET_ITEM(out, i, (PyObject *)c);
    }
    return out;
}

static PyObject *odd_list(const Buf *odd, const uint8_t *base) {
    const size_t rec = sizeof(int32_t) + sizeof(int64_t) + 2 * sizeof(Py_ssize_t);
    size_t n = odd->len / rec;
    PyObject *out = PyList_New((Py_ssize_t)n);
    if (!out) return NULL;
    for (size_t i = 0; i < n; i++) {
        const char *r = odd->data + i * rec;
        int32_t col;
        int64_t row;
        Py_ssize_t off, len;
        memcpy(&col, r, sizeof col);
        memcpy(&row, r + sizeof col, sizeof row);
        memcpy(&off, r + sizeof col + sizeof row, sizeof off);
        memcpy(&len, r + sizeof col + sizeof row + sizeof off, sizeof len);
        PyObject *t = Py_BuildValue("(iLy#)", (int)col, (long long)row, (const char *)base + off, len);
        if (!t) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    return out;
}

static PyObject *span_list(const Buf *mem) {
    size_t n = mem->len / (2 * sizeof(Py_ssize_t));
    PyObject *out = PyList_New((Py_ssize_t)n);
    if (!out) return NULL;
    const Py_ssize_t *v = (const Py_ssize_t *)mem->data;
    for (size_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(nn)", v[2 * i], v[2 * i + 1]);
        if (!t) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    return out;
}

static void scanner_free(Scanner *s) {
    for (int i = 0; i < N_X; i++) free(s->x[i].data);
    for (int i = 0; i < 6; i++) free(s->fl[i].data);
    table_free(&s->names);
    table_free(&s->xcats);
    table_free(&s->phs);
    table_free(&s->flcats);
    table_free(&s->dims);
    table_free(&s->types);
    for (int i = 0; i < 3; i++) free(s->shape[i].data);
    free(s->odd.data);
    free(s->mem.data);
}

static PyObject *scan(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return NULL;
    Scanner s;
    memset(&s, 0, sizeof s);
    memset(s.next_key, -1, sizeof s.next_key);
    s.base = (const uint8_t *)view.buf;
    s.p = s.base;
    s.end = s.base + view.len;
    int r;
    /* The scan touches no Python object (but for the rare exact float parse, which takes the GIL
     * back), so other threads run meanwhile: lists are scanned in parallel threads (load.py). */
    Py_BEGIN_ALLOW_THREADS
    r = scan_list(&s);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (r == NOMEM) {
        PyErr_NoMemory();
    } else if (r == REFUSE) {
        out = Py_None;
        Py_INCREF(out);
    } else {
        PyObject *parts[11] = {columns(s.x, N_X),         columns(s.fl, 6),          bytes_list(&s.names, s.base),
                               bytes_list(&s.xcats, s.base), bytes_list(&s.phs, s.base), bytes_list(&s.flcats, s.base),
                               odd_list(&s.odd, s.base),  span_list(&s.mem),       columns(s.shape, 3),
                               bytes_list(&s.dims, s.base), bytes_list(&s.types, s.base)};
        int ok = 1;
        for (int i = 0; i < 11; i++) ok = ok && parts[i] != NULL;
        if (ok) {
            out = Py_BuildValue("(nNNNNNNNNNNN)", s.n_events, parts[0], parts[1], parts[2], parts[3], parts[4],
                                parts[5], parts[6], parts[7], parts[8], parts[9], parts[10]);
        } else {
            for (int i = 0; i < 11; i++) Py_XDECREF(parts[i]);
        }
    }
    scanner_free(&s);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O, "Columns of a JSON list of plain trace events, or None (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods, NULL, NULL, NULL, NULL};

/* Bumped whenever scan()'s result changes shape other than by the schema (its digest, SCAN_SCHEMA, is
 * checked too), so a stale build is never used (scan.py checks both). */
#define SCAN_ABI 4

PyMODINIT_FUNC PyInit__scan(void) {
    if (arg_keys_init() != 0) {
        PyErr_SetString(PyExc_ImportError, "lmprof.trace.kineto._scan: ambiguous args key table");
        return NULL; /* lmprof then reads traces with msgspec alone */
    }
    key_words_init();
    if (PyType_Ready(&ColumnType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "ABI", SCAN_ABI) != 0 ||
              PyModule_AddStringConstant(m, "SCHEMA", SCAN_SCHEMA) != 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
