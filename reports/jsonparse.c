/* JSON reader (jsonparse.h): recursive descent over the text. */
#include "jsonparse.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct parser {
    const char *s;
    size_t n, i;
    char *err;
    size_t errlen;
    int failed;
} parser;

static void fail(parser *p, const char *what)
{
    if (!p->failed)
        snprintf(p->err, p->errlen, "%s at offset %zu", what, p->i);
    p->failed = 1;
}

static void skip_ws(parser *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static int literal(parser *p, const char *word)
{
    size_t l = strlen(word);
    if (p->n - p->i < l || memcmp(p->s + p->i, word, l) != 0) {
        fail(p, "invalid literal");
        return 0;
    }
    p->i += l;
    return 1;
}

static int hex4(parser *p, unsigned *out)
{
    if (p->n - p->i < 4) {
        fail(p, "short \\u escape");
        return 0;
    }
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i++];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else {
            fail(p, "bad \\u escape");
            return 0;
        }
    }
    *out = v;
    return 1;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* at the opening quote; a decoded, NUL-terminated copy */
static char *string(parser *p)
{
    p->i++;
    size_t start = p->i;
    /* the decoded text is never longer than the escaped one */
    size_t end = start;
    while (end < p->n && p->s[end] != '"') {
        if (p->s[end] == '\\')
            end++;
        end++;
    }
    if (end >= p->n) {
        fail(p, "unterminated string");
        return NULL;
    }
    char *out = cs_xrealloc(NULL, end - start + 1), *o = out;
    while (p->s[p->i] != '"') {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20) {
            fail(p, "control character in string");
            free(out);
            return NULL;
        }
        p->i++;
        if (c != '\\') {
            *o++ = (char)c;
            continue;
        }
        char e = p->s[p->i++];
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp;
            if (!hex4(p, &cp)) {
                free(out);
                return NULL;
            }
            if (cp >= 0xD800 && cp < 0xDC00 && p->n - p->i >= 6 && p->s[p->i] == '\\' &&
                p->s[p->i + 1] == 'u') {
                size_t save = p->i;
                unsigned lo;
                p->i += 2;
                if (hex4(p, &lo) && lo >= 0xDC00 && lo < 0xE000)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else if (p->failed) {
                    free(out);
                    return NULL;
                } else
                    p->i = save;
            }
            if (cp >= 0xD800 && cp < 0xE000)
                cp = 0xFFFD;
            /* 6 escaped bytes (12 for a pair) never decode to more */
            o += put_utf8(o, cp);
            break;
        }
        default:
            fail(p, "bad escape");
            free(out);
            return NULL;
        }
    }
    p->i++;
    *o = 0;
    return out;
}

static void number(parser *p, cs_jv *v)
{
    size_t start = p->i;
    int plain = 1;
    if (p->s[p->i] == '-') {
        plain = 0;
        p->i++;
    }
    size_t digits = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
        p->i++;
    if (p->i == digits || (p->s[digits] == '0' && p->i - digits > 1)) {
        fail(p, "bad number");
        return;
    }
    if (p->i < p->n && p->s[p->i] == '.') {
        plain = 0;
        size_t f = ++p->i;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
        if (p->i == f) {
            fail(p, "bad number");
            return;
        }
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        plain = 0;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        size_t e = p->i;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
        if (p->i == e) {
            fail(p, "bad number");
            return;
        }
    }
    v->type = CS_JV_NUM;
    char buf[64];
    size_t l = p->i - start;
    if (l < sizeof buf) {
        memcpy(buf, p->s + start, l);
        buf[l] = 0;
        v->num = strtod(buf, NULL);
    }
    if (plain) {
        uint64_t u = 0;
        int fits = 1;
        for (size_t k = digits; k < p->i && fits; k++) {
            unsigned d = (unsigned)(p->s[k] - '0');
            if (u > (UINT64_MAX - d) / 10)
                fits = 0;
            else
                u = u * 10 + d;
        }
        v->is_uint = fits;
        v->u = fits ? u : 0;
    }
}

static void value(parser *p, cs_jv *v, int depth);

static void push(cs_jv *v, size_t *cap)
{
    if (v->n == *cap) {
        *cap = *cap ? *cap * 2 : 4;
        v->items = cs_xrealloc(v->items, *cap * sizeof *v->items);
        if (v->type == CS_JV_OBJ)
            v->keys = cs_xrealloc(v->keys, *cap * sizeof *v->keys);
    }
    memset(&v->items[v->n], 0, sizeof v->items[v->n]);
    v->n++;
}

static void container(parser *p, cs_jv *v, int depth, int obj)
{
    v->type = obj ? CS_JV_OBJ : CS_JV_ARR;
    size_t cap = 0;
    char close = obj ? '}' : ']';
    p->i++;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return;
    }
    for (;;) {
        char *key = NULL;
        if (obj) {
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') {
                fail(p, "expected a key");
                return;
            }
            if (!(key = string(p)))
                return;
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                free(key);
                fail(p, "expected ':'");
                return;
            }
            p->i++;
        }
        push(v, &cap);
        if (obj)
            v->keys[v->n - 1] = key;
        value(p, &v->items[v->n - 1], depth + 1);
        if (p->failed)
            return;
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            return;
        }
        fail(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        return;
    }
}

static void value(parser *p, cs_jv *v, int depth)
{
    if (depth > MAX_DEPTH) {
        fail(p, "nested too deep");
        return;
    }
    skip_ws(p);
    if (p->i >= p->n) {
        fail(p, "unexpected end");
        return;
    }
    switch (p->s[p->i]) {
    case '{':
        container(p, v, depth, 1);
        break;
    case '[':
        container(p, v, depth, 0);
        break;
    case '"':
        v->type = CS_JV_STR;
        v->str = string(p);
        break;
    case 't':
        v->type = CS_JV_BOOL;
        v->boolean = literal(p, "true");
        break;
    case 'f':
        v->type = CS_JV_BOOL;
        literal(p, "false");
        break;
    case 'n':
        literal(p, "null");
        break;
    default:
        if (p->s[p->i] == '-' || (p->s[p->i] >= '0' && p->s[p->i] <= '9'))
            number(p, v);
        else
            fail(p, "unexpected character");
    }
}

static void release(cs_jv *v)
{
    for (size_t i = 0; i < v->n; i++) {
        release(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
}

void cs_jv_free(cs_jv *v)
{
    if (!v)
        return;
    release(v);
    free(v);
}

cs_jv *cs_jv_parse(const char *text, size_t len, char *err, size_t errlen)
{
    parser p = {.s = text, .n = len, .err = err, .errlen = errlen};
    cs_jv *v = cs_xcalloc(1, sizeof *v);
    value(&p, v, 0);
    if (!p.failed) {
        skip_ws(&p);
        if (p.i != p.n)
            fail(&p, "text after the value");
    }
    if (p.failed) {
        cs_jv_free(v);
        return NULL;
    }
    return v;
}

const cs_jv *cs_jv_get(const cs_jv *obj, const char *key)
{
    if (!obj || obj->type != CS_JV_OBJ)
        return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return &obj->items[i];
    return NULL;
}

const char *cs_jv_str(const cs_jv *obj, const char *key)
{
    const cs_jv *v = cs_jv_get(obj, key);
    return v && v->type == CS_JV_STR && v->str ? v->str : "";
}

uint64_t cs_jv_uint(const cs_jv *obj, const char *key, uint64_t dflt)
{
    const cs_jv *v = cs_jv_get(obj, key);
    return v && v->type == CS_JV_NUM && v->is_uint ? v->u : dflt;
}

uint64_t cs_jv_hex(const cs_jv *obj, const char *key)
{
    const cs_jv *v = cs_jv_get(obj, key);
    if (v && v->type == CS_JV_NUM)
        return v->is_uint ? v->u : 0;
    if (!v || v->type != CS_JV_STR || !v->str)
        return 0;
    const char *s = v->str;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
        s += 2;
    uint64_t u = 0;
    for (int k = 0; *s && k < 16; s++, k++) {
        char c = *s;
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                   : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
        if (d == 16)
            return 0;
        u = u << 4 | d;
    }
    return *s ? 0 : u;
}

int cs_jv_bool(const cs_jv *obj, const char *key)
{
    const cs_jv *v = cs_jv_get(obj, key);
    return v && v->type == CS_JV_BOOL && v->boolean;
}
