#!/usr/bin/env python3
"""Summarises benches/cpu-rounds/run.sh: medians (min–max) over the rounds in which the other
processes used at most THRESHOLD cores during every run, then over all rounds.
Usage: summary.py DIR [THRESHOLD]"""
import re
import statistics as st
import sys
import os
d=sys.argv[1]; thr=float(sys.argv[2]) if len(sys.argv)>2 else 0.10
def num(s): return float(re.match(r'\s*([0-9.]+)',s).group(1))
def rate(k,us): return 768/us*1e3 if k=='gpt' else 2*int(k.split('_')[1])**3/us/1e3
R=[]
r=1
while os.path.exists(f'{d}/ours_{r}.load') and os.path.exists(f'{d}/peer_{r}.load'):
    rec={'r':r,'load':{}}
    for n in ('base','ours','peer','exact'):
        if os.path.exists(f'{d}/{n}_{r}.load'):
            w,o=open(f'{d}/{n}_{r}.load').read().split(); rec['load'][n]=float(o)
    for l in (open(f'{d}/base_{r}.md') if os.path.exists(f'{d}/base_{r}.md') else []):
        m=re.match(r'\| (sgemm_\d+|gpt_cpu_step) \| ([0-9.]+) \|',l)
        if m:
            k='gpt' if m.group(1)=='gpt_cpu_step' else m.group(1)
            rec[('base',k)]=rate(k,float(m.group(2)))
        # a build of this cpu-bench as the baseline (GPT_ONLY=1)
        m=re.match(r'\| (sgemm_\d+|gpt_cpu_step) \([^)]*\) \|([^|]*)\|',l)
        if m:
            k='gpt' if m.group(1)=='gpt_cpu_step' else m.group(1)
            rec[('base',k)]=num(m.group(2))
    for l in open(f'{d}/ours_{r}.md'):
        m=re.match(r'\| (sgemm_\d+|gpt_cpu_step) \([^)]*\) \|([^|]*)\|',l)
        if m:
            k='gpt' if m.group(1)=='gpt_cpu_step' else m.group(1)
            rec[('ours',k)]=num(m.group(2))
    for l in (open(f'{d}/exact_{r}.md') if os.path.exists(f'{d}/exact_{r}.md') else []):
        m=re.match(r'\| (gpt_cpu_step) \([^)]*\) \|([^|]*)\|',l)
        if m: rec[('exact','gpt')]=num(m.group(2))
    for l in open(f'{d}/peer_{r}.out'):
        m=re.match(r'(numpy|torch)_(sgemm_\d+) ([0-9.]+)$',l.strip())
        if m: rec[(m.group(1),m.group(2))]=rate(m.group(2),float(m.group(3)))
        m=re.match(r'gpt_cpu_step ([0-9.]+)$',l.strip())
        if m: rec[('torch','gpt')]=rate('gpt',float(m.group(1)))
    R.append(rec); r+=1
def sp(v,dg): return f"{st.median(v):.{dg}f} ({min(v):.{dg}f}–{max(v):.{dg}f})" if v else '–'
def table(rs,title):
    print(f"### {title}: {len(rs)} rounds {[x['r'] for x in rs]}")
    print("| row | ours | numpy | PyTorch | before (BASE_BIN) | ours exact mode | ours / numpy | ours / PyTorch | ours / before |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in ('sgemm_1024','sgemm_1536','sgemm_2048','gpt'):
        dg=1 if k=='gpt' else 0
        g=lambda n:[x[(n,k)] for x in rs if (n,k) in x]
        rat=lambda n:[x[('ours',k)]/x[(n,k)] for x in rs if (n,k) in x and ('ours',k) in x]
        name = 'GPT train step (K tok/s)' if k=='gpt' else f'SGEMM {k[6:]}³ (GFLOP/s)'
        print(f"| {name} | {sp(g('ours'),dg)} | {sp(g('numpy'),dg)} | {sp(g('torch'),dg)} | {sp(g('base'),dg)} | {sp(g('exact'),dg)} | {sp(rat('numpy'),2)} | {sp(rat('torch'),2)} | {sp(rat('base'),2)} |")
    print()
quiet=[x for x in R if max(x['load'].values())<=thr]
table(quiet,f"quiet rounds (other processes used at most {thr} of a core during each run)")
table(R,"all rounds")
print("others per round (base ours peer exact):")
for x in R: print(x['r'], [round(x['load'][n],2) for n in ('base','ours','peer','exact') if n in x['load']], 'gpt ours/torch', round(x.get(('ours','gpt'),0)/x.get(('torch','gpt'),1),2))
