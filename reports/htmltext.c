/* Text as the HTML page writes it: every string from a trace escaped
 * (HTML metacharacters, control bytes, invalid UTF-8: the page never has
 * a parse error), byte sizes and durations in human units. */
#include "html_int.h"
#include "utf8.h"

#include <string.h>

void cs_html_text(FILE *out, const char *str)
{
    if (!str)
        return;
    const unsigned char *s = (const unsigned char *)str;
    size_t left = strlen(str);
    while (left) {
        unsigned c = *s;
        size_t n = 1;
        switch (c) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        case '\'': fputs("&#39;", out); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                /* visible, and never a parse error */
                fprintf(out, "\\x%02x", c);
            } else if ((n = cs_utf8_len(s, left)) == 0) {
                fputs("\xef\xbf\xbd", out);  /* U+FFFD */
                n = 1;
            } else {
                fwrite(s, 1, n, out);
            }
        }
        s += n;
        left -= n;
    }
}

/* a double: an axis label may lie beyond UINT64_MAX (a plot's top is the
 * largest value rounded up, and converting that back was undefined) */
void html_human_bytes(char *buf, size_t n, double b)
{
    if (b < 1024)
        snprintf(buf, n, "%.0f B", b);
    else if (b < 1024ull * 1024)
        snprintf(buf, n, "%.1f KiB", b / 1024.0);
    else if (b < 1024ull * 1024 * 1024)
        snprintf(buf, n, "%.1f MiB", b / (1024.0 * 1024));
    else
        snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024 * 1024));
}

void html_human_time(char *buf, size_t n, double ns)
{
    if (ns < 0)
        ns = 0;
    if (ns < 1e3)
        snprintf(buf, n, "%.0f ns", ns);
    else if (ns < 1e6)
        snprintf(buf, n, "%.3g µs", ns / 1e3);
    else if (ns < 1e9)
        snprintf(buf, n, "%.4g ms", ns / 1e6);
    else
        snprintf(buf, n, "%.4g s", ns / 1e9);
}
