/*
 * compare_report.c - freshet compare's reports: DIR/report.json (every
 * run's figures and curve, the aggregates, the verdict), DIR/report.md
 * (one table per cell, a line per mode, then the verdict) and
 * DIR/report.html (self-contained: the JSON and Chart.js inlined, as the
 * dashboard draws with it; without Chart.js the page says so and draws no
 * chart).
 *
 * Threads: main thread only.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "app/compare.h"

#define KV_NUM(f, key, v) (fputs(",\"" key "\":", f), app_json_num(f, v))

static void json_curve(FILE *f, const cmp_curve_t *c)
{
    fputs(",\"curve\":[", f);
    for (size_t i = 0; i < c->n; i++) {
        const cmp_point_t *p = &c->pts[i];
        fprintf(f, "%s{\"version\":%lld,\"t_s\":", i ? "," : "", (long long)p->version);
        app_json_num(f, p->t_s);
        fprintf(f, ",\"samples\":%lld,\"accuracy\":", (long long)p->samples);
        app_json_num(f, p->accuracy);
        fputs(",\"loss\":", f);
        app_json_num(f, p->loss);
        fputc('}', f);
    }
    fputc(']', f);
}

static void json_run(FILE *f, const cmp_run_t *r)
{
    fputs("{\"model\":", f);
    app_json_str(f, r->model);
    fputs(",\"mode\":", f);
    app_json_str(f, r->mode);
    fprintf(f, ",\"workers\":%d,\"straggler\":%s,\"seed\":%lld,\"ok\":%s,\"exit_status\":%d",
            r->workers, r->straggler ? "true" : "false", (long long)r->seed,
            r->ok ? "true" : "false", r->exit_status);
    if (!r->ok) {
        fputs(",\"error\":", f);
        app_json_str(f, r->error);
        fputc('}', f);
        return;
    }
    fprintf(f, ",\"samples\":%lld,\"versions\":%lld,\"final_version\":%lld", (long long)r->samples,
            (long long)r->versions, (long long)r->final_version);
    KV_NUM(f, "wall_s", r->wall_s);
    KV_NUM(f, "samples_per_s", r->samples_per_s);
    KV_NUM(f, "accuracy", r->accuracy);
    KV_NUM(f, "loss", r->loss);
    KV_NUM(f, "tau_p50", r->tau_p50);
    KV_NUM(f, "tau_p99", r->tau_p99);
    KV_NUM(f, "lr_eff_mean", r->lr_eff_mean);
    KV_NUM(f, "waits_s", r->waits_s);
    KV_NUM(f, "push_s", r->push_s);
    KV_NUM(f, "compute_s", r->compute_s);
    KV_NUM(f, "rounds", r->rounds);
    fprintf(f, ",\"round_entries\":%lld", (long long)r->round_entries);
    KV_NUM(f, "failed_batches", r->failed_batches);
    KV_NUM(f, "target_t_s", r->target_t_s);
    KV_NUM(f, "target_samples", r->target_samples);
    fprintf(f, ",\"drops_total\":%lld,\"drops\":{", (long long)r->drops_total);
    for (int d = 0; d < r->ndrops; d++) {
        fputs(d ? "," : "", f);
        app_json_str(f, r->drop_reason[d]);
        fprintf(f, ":%lld", (long long)r->drops[d]);
    }
    fputc('}', f);
    json_curve(f, &r->curve);
    fputc('}', f);
}

static void json_series(FILE *f, const char *key, const double *v)
{
    fprintf(f, ",\"%s\":[", key);
    for (int j = 0; j < CMP_CURVE_GRID; j++) {
        fputs(j ? "," : "", f);
        app_json_num(f, v[j]);
    }
    fputc(']', f);
}

static void json_agg(FILE *f, const cmp_agg_t *a)
{
    fputs("{\"mode\":", f);
    app_json_str(f, a->mode);
    fprintf(f, ",\"workers\":%d,\"straggler\":%s,\"runs\":%d,\"ok\":%d,\"reached\":%d", a->workers,
            a->straggler ? "true" : "false", a->runs, a->ok, a->reached);
    KV_NUM(f, "accuracy_mean", a->acc_mean);
    KV_NUM(f, "accuracy_sd", a->acc_sd);
    KV_NUM(f, "loss_mean", a->loss_mean);
    KV_NUM(f, "samples_mean", a->samples_mean);
    KV_NUM(f, "target_t_s_mean", a->t_target_mean);
    KV_NUM(f, "target_t_s_sd", a->t_target_sd);
    KV_NUM(f, "target_samples_mean", a->s_target_mean);
    KV_NUM(f, "samples_per_s", a->sps_mean);
    KV_NUM(f, "speedup", a->speedup);
    KV_NUM(f, "tau_p50", a->tau_p50);
    KV_NUM(f, "tau_p99", a->tau_p99);
    KV_NUM(f, "lr_eff", a->lr_eff);
    KV_NUM(f, "waits_s", a->waits_s);
    KV_NUM(f, "drops", a->drops);
    KV_NUM(f, "rounds", a->rounds);
    if (a->error[0] != '\0') {
        fputs(",\"error\":", f);
        app_json_str(f, a->error);
    }
    json_series(f, "curve_t_s", a->curve_t);
    json_series(f, "curve_t_accuracy", a->curve_t_acc);
    json_series(f, "curve_samples", a->curve_s);
    json_series(f, "curve_samples_accuracy", a->curve_s_acc);
    fputc('}', f);
}

static void json_report(FILE *f, const cmp_grid_t *g, const cmp_verdict_t *v)
{
    fputs("{\"config\":", f);
    app_json_str(f, g->config);
    fprintf(f, ",\"samples\":%lld,\"seeds\":%d,\"straggler\":", (long long)g->samples, g->seeds);
    if (g->straggler != NULL)
        app_json_str(f, g->straggler);
    else
        fputs("null", f);
    KV_NUM(f, "target", g->target);
    fprintf(f, ",\"target_source\":\"%s\",\"baseline\":{\"mode\":",
            g->target_given ? "--target" : "0.98 x the best cell's mean final accuracy");
    app_json_str(f, g->baseline_mode);
    fprintf(f, ",\"workers\":%d,\"straggler\":false", g->baseline_workers);
    KV_NUM(f, "samples_per_s", g->baseline_sps);
    fputs("},\"runs\":[", f);
    for (size_t i = 0; i < g->nruns; i++) {
        fputs(i ? ",\n" : "\n", f);
        json_run(f, &g->runs[i]);
    }
    fputs("],\"aggregates\":[", f);
    for (size_t i = 0; i < g->naggs; i++) {
        fputs(i ? ",\n" : "\n", f);
        json_agg(f, &g->aggs[i]);
    }
    fputs("],\"verdict\":[", f);
    for (size_t i = 0; i < v->n; i++) {
        fputs(i ? ",\n{\"scope\":" : "\n{\"scope\":", f);
        app_json_str(f, v->lines[i].scope);
        fputs(",\"question\":", f);
        app_json_str(f, v->lines[i].question);
        fputs(",\"status\":", f);
        app_json_str(f, v->lines[i].status);
        fputs(",\"text\":", f);
        app_json_str(f, v->lines[i].text);
        fputc('}', f);
    }
    fputs("]}\n", f);
}

/* A number for the tables: "-" when not finite. */
static const char *md_num(char *buf, size_t size, const char *fmt, double v)
{
    if (!isfinite(v))
        return "-";
    snprintf(buf, size, fmt, v);
    return buf;
}

static void md_cell(FILE *f, const cmp_grid_t *g, const cmp_agg_t *c0)
{
    char b[13][32];
    fprintf(f,
            "\n## %d workers, %s\n\n"
            "| mode | runs ok | accuracy (sd) | samples | time to target s | samples to target | "
            "samples/s | speed-up | tau p50/p99 | lr_eff | waits s | drops | rounds |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
            c0->workers, c0->straggler ? "straggler" : "no straggler");
    for (size_t i = 0; i < g->naggs; i++) {
        const cmp_agg_t *a = &g->aggs[i];
        if (a->workers != c0->workers || a->straggler != c0->straggler)
            continue;
        if (a->ok == 0) {
            fprintf(f, "| %s | 0/%d | failed: %s | | | | | | | | | | |\n", a->mode, a->runs,
                    a->error);
            continue;
        }
        fprintf(f,
                "| %s | %d/%d | %s (%s) | %s | %s (%d reached) | %s | %s | %s | %s/%s | %s | "
                "%s | %s | %s |\n",
                a->mode, a->ok, a->runs, md_num(b[0], 32, "%.4f", a->acc_mean),
                md_num(b[1], 32, "%.4f", a->acc_sd), md_num(b[2], 32, "%.0f", a->samples_mean),
                md_num(b[3], 32, "%.2f", a->t_target_mean), a->reached,
                md_num(b[4], 32, "%.0f", a->s_target_mean), md_num(b[5], 32, "%.0f", a->sps_mean),
                md_num(b[6], 32, "%.2f", a->speedup), md_num(b[7], 32, "%.0f", a->tau_p50),
                md_num(b[8], 32, "%.0f", a->tau_p99), md_num(b[9], 32, "%.4g", a->lr_eff),
                md_num(b[10], 32, "%.2f", a->waits_s), md_num(b[11], 32, "%.0f", a->drops),
                md_num(b[12], 32, "%.0f", a->rounds));
    }
}

static void md_report(FILE *f, const cmp_grid_t *g, const cmp_verdict_t *v)
{
    fprintf(f,
            "# freshet compare\n\n"
            "`%s`, %lld samples per run, %d seed(s), straggler %s. Target accuracy %.4f (%s). "
            "Speed-up: samples/s over the samples/s of %s at %d worker(s), no straggler. "
            "Accuracy: the final weights of each run, read from Redis and scored on [eval] "
            "(mean and sd over seeds); time from each run's first version. Curves: periodic "
            "holdout evaluations (the evals stream) stamped with version, time and samples.\n",
            g->config, (long long)g->samples, g->seeds, g->straggler ? g->straggler : "none",
            g->target, g->target_given ? "--target" : "0.98 x the best cell's mean final accuracy",
            g->baseline_mode, g->baseline_workers);
    for (size_t i = 0; i < g->naggs; i++) {
        int seen = 0;
        for (size_t j = 0; j < i; j++)
            seen |= g->aggs[j].workers == g->aggs[i].workers &&
                    g->aggs[j].straggler == g->aggs[i].straggler;
        if (!seen)
            md_cell(f, g, &g->aggs[i]);
    }
    fputs("\n## Verdict\n\n", f);
    const char *scope = "";
    for (size_t i = 0; i < v->n; i++) {
        const cmp_vline_t *l = &v->lines[i];
        if (strcmp(scope, l->scope) != 0)
            fprintf(f, "\n**%s**\n\n", scope = l->scope);
        fprintf(f, "- %s (%s): %s\n", l->question, l->status, l->text);
    }
    fputs("\n## Runs\n\n| model | mode | workers | straggler | seed | result |\n"
          "| --- | --- | --- | --- | --- | --- |\n",
          f);
    for (size_t i = 0; i < g->nruns; i++) {
        const cmp_run_t *r = &g->runs[i];
        char res[CMP_ERR_MAX + 64];
        if (r->ok)
            snprintf(res, sizeof(res), "%lld samples, %lld versions, accuracy %.4f",
                     (long long)r->samples, (long long)r->versions, r->accuracy);
        else
            snprintf(res, sizeof(res), "failed: %s", r->error);
        fprintf(f, "| %s | %s | %d | %s | %lld | %s |\n", r->model, r->mode, r->workers,
                r->straggler ? "yes" : "no", (long long)r->seed, res);
    }
}

/* The page's script: tables, charts (one per cell and axis, a line per
 * mode) and the verdict, drawn from REPORT. */
static const char html_script[] =
    "const fmt=(v,d)=>v===null||v===undefined?'-':Number(v).toFixed(d);\n"
    "const el=(t,html)=>{const e=document.createElement(t);if(html!==undefined)e.innerHTML=html;"
    "return e;};\n"
    "const esc=s=>String(s).replace(/[&<>]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;'}[c]));\n"
    "const main=document.getElementById('cells');const cells=[];\n"
    "for(const a of REPORT.aggregates){let c=cells.find(c=>c.workers===a.workers&&"
    "c.straggler===a.straggler);if(!c){c={workers:a.workers,straggler:a.straggler,aggs:[]};"
    "cells.push(c);}c.aggs.push(a);}\n"
    "const colors=['#1f77b4','#d62728','#2ca02c','#ff7f0e','#9467bd','#8c564b','#e377c2',"
    "'#17becf'];\n"
    "window.reportCharts=[];\n"
    "cells.forEach((c,ci)=>{\n"
    " main.appendChild(el('h2',c.workers+' workers, '+(c.straggler?'straggler '+"
    "esc(REPORT.straggler):'no straggler')));\n"
    " let t='<tr><th>mode</th><th>runs ok</th><th>accuracy (sd)</th><th>time to target s</th>"
    "<th>samples to target</th><th>samples/s</th><th>speed-up</th><th>tau p50/p99</th>"
    "<th>lr_eff</th><th>waits s</th><th>drops</th><th>rounds</th></tr>';\n"
    " for(const a of c.aggs){t+=a.ok===0?'<tr><td>'+esc(a.mode)+'</td><td>0/'+a.runs+"
    "'</td><td colspan=10>failed: '+esc(a.error||'')+'</td></tr>':'<tr><td>'+esc(a.mode)+"
    "'</td><td>'+a.ok+'/'+a.runs+'</td><td>'+fmt(a.accuracy_mean,4)+' ('+fmt(a.accuracy_sd,4)+"
    "')</td><td>'+fmt(a.target_t_s_mean,2)+'</td><td>'+fmt(a.target_samples_mean,0)+"
    "'</td><td>'+fmt(a.samples_per_s,0)+'</td><td>'+fmt(a.speedup,2)+'</td><td>'+"
    "fmt(a.tau_p50,0)+'/'+fmt(a.tau_p99,0)+'</td><td>'+fmt(a.lr_eff,4)+'</td><td>'+"
    "fmt(a.waits_s,2)+'</td><td>'+fmt(a.drops,0)+'</td><td>'+fmt(a.rounds,0)+'</td></tr>';}\n"
    " main.appendChild(el('table',t));\n"
    " if(typeof Chart==='undefined')return;\n"
    " for(const [axis,xs,ys,label] of [['time','curve_t_s','curve_t_accuracy','seconds since "
    "the first version'],['samples','curve_samples','curve_samples_accuracy','samples "
    "applied']]){\n"
    "  const box=el('div');box.className='chart';const cv=el('canvas');"
    "cv.id='chart-'+axis+'-'+ci;box.appendChild(cv);main.appendChild(box);\n"
    "  const ds=c.aggs.filter(a=>a.ok>0).map((a,i)=>({label:a.mode,borderColor:colors[i%8],"
    "backgroundColor:colors[i%8],pointRadius:0,data:a[xs].map((x,j)=>({x:x,y:a[ys][j]}))"
    ".filter(p=>p.y!==null)}));\n"
    "  const ch=new Chart(cv,{type:'line',data:{datasets:ds},options:{animation:false,"
    "responsive:true,maintainAspectRatio:false,scales:{x:{type:'linear',title:{display:true,"
    "text:label}},y:{title:{display:true,text:'holdout accuracy'}}},plugins:{title:{display:"
    "true,text:'accuracy against '+axis}}}});\n"
    "  window.reportCharts.push({id:cv.id,datasets:ds.length});\n"
    " }\n"
    "});\n"
    "const v=document.getElementById('verdict');let scope='';\n"
    "for(const l of REPORT.verdict){if(l.scope!==scope){scope=l.scope;v.appendChild(el('h3',"
    "esc(scope)));}v.appendChild(el('p','<b>'+esc(l.question)+'</b> ('+esc(l.status)+'): '+"
    "esc(l.text)));}\n"
    "document.body.dataset.charts=String(window.reportCharts.length);\n";

/* Chart.js's text inlined, or a notice in the page (which then draws
 * tables only). */
static void html_chartjs(FILE *f, const char *path)
{
    FILE *js = path[0] != '\0' ? fopen(path, "rb") : NULL;
    if (js == NULL) {
        fputs("<p class=notice id=nochart>Chart.js not found at ", f);
        for (const char *p = path; *p; p++)
            fputc(*p == '<' ? '_' : *p, f);
        fputs(" (Debian: apt-get install libjs-chart.js; [serve] chartjs names it): no "
              "charts.</p>\n",
              f);
        return;
    }
    char buf[65536];
    size_t n;
    fputs("<script>\n", f);
    while ((n = fread(buf, 1, sizeof(buf), js)) > 0)
        fwrite(buf, 1, n, f);
    fputs("\n</script>\n", f);
    fclose(js);
}

static void html_report(FILE *f, const cmp_grid_t *g, const cmp_verdict_t *v)
{
    fputs("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>freshet "
          "compare</title>\n<style>body{font:14px sans-serif;margin:2em;max-width:1300px}"
          "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
          "padding:3px 8px;text-align:right}td:first-child{text-align:left}"
          ".chart{display:inline-block;width:620px;height:320px;margin:0 10px 20px 0}"
          ".notice{color:#a00}</style>\n</head><body>\n<h1>freshet compare</h1>\n",
          f);
    fprintf(f,
            "<p>%lld samples per run, %d seed(s); target accuracy %.4f. Curves: periodic "
            "holdout evaluations stamped with version, time and samples; each mode's line "
            "is the mean of its seeds.</p>\n",
            (long long)g->samples, g->seeds, g->target);
    html_chartjs(f, g->chartjs);
    fputs("<div id=cells></div>\n<h2>Verdict</h2>\n<div id=verdict></div>\n"
          "<script>\nconst REPORT = ",
          f);
    json_report(f, g, v);
    fprintf(f, ";\n%s</script>\n</body></html>\n", html_script);
}

/* Writes DIR/name with fn. 0, or -1 with errstr. */
static int write_one(const char *dir, const char *name, const cmp_grid_t *g, const cmp_verdict_t *v,
                     void (*fn)(FILE *, const cmp_grid_t *, const cmp_verdict_t *), char *errstr,
                     size_t size)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        snprintf(errstr, size, "%s: %s", path, strerror(errno));
        return -1;
    }
    fn(f, g, v);
    if (ferror(f) | (fclose(f) != 0)) {
        snprintf(errstr, size, "%s: write failed", path);
        return -1;
    }
    return 0;
}

int cmp_report_write(const cmp_grid_t *g, const char *dir, char *errstr, size_t size)
{
    cmp_verdict_t *v = malloc(sizeof(*v));
    if (v == NULL) {
        snprintf(errstr, size, "out of memory");
        return -1;
    }
    cmp_verdict(g, v);
    int rc = write_one(dir, "report.json", g, v, json_report, errstr, size);
    if (rc == 0)
        rc = write_one(dir, "report.md", g, v, md_report, errstr, size);
    if (rc == 0)
        rc = write_one(dir, "report.html", g, v, html_report, errstr, size);
    free(v);
    return rc;
}
