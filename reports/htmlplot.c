/* A process's plot: live NumPy data bytes (left axis) and live DLPack
 * tensors (right axis) over time, from the trace's COUNTS series, as SVG
 * that reads without JavaScript; the series are also in data- attributes
 * for the script's read-out. */
#include "html_int.h"

/* plot geometry (SVG user units) */
#define PW 820.0
#define PH 260.0
#define PL 78.0               /* left margin: byte axis labels */
#define PR 62.0               /* right margin: tensor axis labels */
#define PT 16.0
#define PB 40.0

static double nice_ceil(double v)
{
    if (v <= 0)
        return 1;
    double p = 1;
    while (p * 10 <= v)
        p *= 10;
    while (p > v)
        p /= 10;
    static const double steps[] = {1, 2, 2.5, 5, 10};
    for (int i = 0; i < 5; i++)
        if (steps[i] * p >= v)
            return steps[i] * p;
    return 10 * p;
}

void html_plot(cs_html *h, const cs_html_proc *p)
{
    size_t n = p->ncounts;
    bodyf(h, "<figure class=\"plotbox\"><figcaption>Live NumPy data bytes and live DLPack tensors "
             "over time</figcaption>\n");
    if (!n) {
        bodyf(h, "<p class=\"note\">No COUNTS records in this trace: the plot needs a runtime that "
                 "writes them (every 10 ms while events happen, and at the end).</p></figure>\n");
        return;
    }
    uint64_t origin = h->t_origin;
    if (!origin || p->counts[0].time_ns < origin)
        origin = p->counts[0].time_ns;
    double tmax = 0, npmax = 0, dlmax = 0;
    for (size_t i = 0; i < n; i++) {
        double t = (double)(p->counts[i].time_ns - origin);
        if (t > tmax)
            tmax = t;
        if ((double)p->counts[i].live_numpy_bytes > npmax)
            npmax = (double)p->counts[i].live_numpy_bytes;
        if ((double)p->counts[i].live_dlpack > dlmax)
            dlmax = (double)p->counts[i].live_dlpack;
    }
    if (p->end_time_ns > origin && (double)(p->end_time_ns - origin) > tmax)
        tmax = (double)(p->end_time_ns - origin);
    if (tmax <= 0)
        tmax = 1e6;
    /* at least 0..4 on each axis, so that the ticks differ */
    npmax = nice_ceil(npmax < 4 ? 4 : npmax);
    dlmax = nice_ceil(dlmax < 4 ? 4 : dlmax);
    const double w = PW - PL - PR, ht = PH - PT - PB;
#define X(t) (PL + (t) / tmax * w)
#define YNP(v) (PT + ht - (v) / npmax * ht)
#define YDL(v) (PT + ht - (v) / dlmax * ht)

    bodyf(h, "<svg class=\"plot\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"live memory "
             "plot\" data-n=\"%zu\" data-l=\"%.1f\" data-w=\"%.1f\" data-tmax=\"%.0f\" data-t=\"",
          PW, PH, n, PL, w, tmax);
    for (size_t i = 0; i < n; i++)
        bodyf(h, "%s%llu", i ? "," : "", (unsigned long long)(p->counts[i].time_ns - origin));
    bodyf(h, "\" data-np=\"");
    for (size_t i = 0; i < n; i++)
        bodyf(h, "%s%llu", i ? "," : "", (unsigned long long)p->counts[i].live_numpy_bytes);
    bodyf(h, "\" data-dl=\"");
    for (size_t i = 0; i < n; i++)
        bodyf(h, "%s%llu", i ? "," : "", (unsigned long long)p->counts[i].live_dlpack);
    bodyf(h, "\">\n");
    /* grid and axes */
    char lab[64];
    for (int k = 0; k <= 4; k++) {
        double y = PT + ht - ht * k / 4;
        bodyf(h, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", PL,
              PL + w, y, y);
        html_human_bytes(lab, sizeof lab, npmax * k / 4);
        bodyf(h, "<text class=\"ax np\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>",
              PL - 6, y + 4, lab);
        bodyf(h, "<text class=\"ax dl\" x=\"%.1f\" y=\"%.1f\">%g</text>\n", PL + w + 6, y + 4,
              dlmax * k / 4);
    }
    for (int k = 0; k <= 5; k++) {
        double x = PL + w * k / 5;
        html_human_time(lab, sizeof lab, tmax * k / 5);
        bodyf(h, "<text class=\"ax\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>", x,
              PT + ht + 16, lab);
    }
    bodyf(h, "<text class=\"ax\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time since the "
             "process started</text>\n", PL + w / 2, PH - 4);
    bodyf(h, "<line class=\"axis\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>\n", PL, PL + w,
          PT + ht, PT + ht);
    /* the series */
    bodyf(h, "<polyline class=\"series np\" data-n=\"%zu\" points=\"", n);
    for (size_t i = 0; i < n; i++)
        bodyf(h, "%s%.1f,%.1f", i ? " " : "", X((double)(p->counts[i].time_ns - origin)),
              YNP((double)p->counts[i].live_numpy_bytes));
    bodyf(h, "\"/>\n<polyline class=\"series dl\" data-n=\"%zu\" points=\"", n);
    for (size_t i = 0; i < n; i++)
        bodyf(h, "%s%.1f,%.1f", i ? " " : "", X((double)(p->counts[i].time_ns - origin)),
              YDL((double)p->counts[i].live_dlpack));
    bodyf(h, "\"/>\n<line class=\"cursor\" x1=\"-10\" x2=\"-10\" y1=\"%.1f\" y2=\"%.1f\"/>"
             "<text class=\"readout\" x=\"%.1f\" y=\"%.1f\"></text>\n</svg>\n",
          PT, PT + ht, PL + 8, PT + 12);
#undef X
#undef YNP
#undef YDL
    bodyf(h, "<p class=\"legend\"><span class=\"key np\"></span>live NumPy data bytes (left axis) "
             "<span class=\"key dl\"></span>live DLPack tensors (right axis) &middot; %zu point(s)",
          n);
    if (p->counts_stride > 1)
        bodyf(h, ", downsampled from %llu COUNTS records: each point is the maximum of %llu "
                 "consecutive records", (unsigned long long)p->counts_records,
              (unsigned long long)p->counts_stride);
    bodyf(h, "</p></figure>\n");
}
