import json, statistics as st
R=[json.load(open(f'/tmp/gbench/results_run{i}.json')) for i in (1,2,3)]
L={'llg':'llguidance 1.9.1','xgr':'xgrammar 0.2.9 (stub torch)'}
def med(f): return st.median(f(r) for r in R)
def rng(f): v=[f(r) for r in R]; return f"{min(v):.2f}–{max(v):.2f}"
print("| | llguidance | xgrammar |\n|---|---|---|")
print("| tokenizer init, ms (LLTokenizer / TokenizerInfo from 49152 encoded tokens) | %.0f | %.0f |"%(med(lambda r:r['llg']['tok_init_ms']),med(lambda r:r['xgr']['tok_init_ms'])))
print("| GrammarCompiler init, ms | – | %.2f |"%med(lambda r:r['xgr']['compiler_init_ms']))
print("| import + tokenizer init, ms | %.0f | %.0f |\n"%(med(lambda r:r['llg']['import_plus_init_ms']),med(lambda r:r['xgr']['import_plus_init_ms'])))
W=['nested','flat3','json_object']
print("| schema (tokens) | lib | compile cold ms | compile repeat ms | 1st mask µs | pass-1 median / p90 / max µs | pass-1 total ms | warm median / p90 µs | warm total ms per walk |")
print("|---|---|---|---|---|---|---|---|---|")
for w in W:
    for l in ('llg','xgr'):
        g=lambda f: med(lambda r: f(r[l]['workloads'][w]))
        n=R[0][l]['workloads'][w]['n_tokens']
        print(f"| {w} ({n}) | {l} | {g(lambda x:x['compile_cold_ms']):.2f} | {g(lambda x:x['compile_repeat_median_ms']):.2f} | {g(lambda x:x['first_mask_us']):.0f} | {g(lambda x:x['pass1']['median_us']):.1f} / {g(lambda x:x['pass1']['p90_us']):.1f} / {g(lambda x:x['pass1']['max_us']):.0f} | {g(lambda x:x['pass1']['total_ms']):.2f} | {g(lambda x:x['warm']['median_us']):.1f} / {g(lambda x:x['warm']['p90_us']):.1f} | {g(lambda x:x['warm']['total_ms'])/5:.2f} |")
print()
print("| schema | lib | rollback checks (mask before consume 5 == after rollback 5) | rollback(5) median µs | mask rejected a valid token | EOS allowed at end | non-EOS special tokens allowed (max over walk) |")
print("|---|---|---|---|---|---|---|")
for w in W:
    for l in ('llg','xgr'):
        x=R[-1][l]['workloads'][w]
        print(f"| {w} | {l} | {x['rollback']['checks']-x['rollback']['mismatches']}/{x['rollback']['checks']} equal | {med(lambda r:r[l]['workloads'][w]['rollback']['rollback5_median_us']):.2f} | {x['tokens_disallowed_by_mask']} | {x['eos_allowed_at_end']} | {x['max_non_eos_special_tokens_allowed']} |")
print()
print("| feature | llguidance | xgrammar |\n|---|---|---|")
def cell(c):
    if not c['compiles']: return f"**rejected**: `{c['message']}`"
    s="compiles; " + ("enforced" if c['valid_accepted'] and c['invalid_rejected'] else f"valid accepted={c['valid_accepted']}, invalid rejected={c['invalid_rejected']} → **silently ignored**")
    if c['message']: s+=f" (warn: {c['message']})"
    return s
for f in R[-1]['llg']['coverage']:
    print(f"| `{f}` | {cell(R[-1]['llg']['coverage'][f])} | {cell(R[-1]['xgr']['coverage'][f])} |")
