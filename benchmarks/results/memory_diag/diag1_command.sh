export PYTHONUNBUFFERED=1; python3 - $OUT/diag.json <<'PY'
import sys,json;sys.path[:0]=['benchmarks','src']
import memory_ramp as M,torch
from leadline.memory import ramp,forbid_spill
from leadline.memory.model_step import ModelStep,add_lora
from leadline.memory.readings import CudaMemory
model,_=M.load(None,False);mem=CudaMemory('cuda:0',card_bytes=int(6*M.GB));pm=add_lora(model,16)
mix=M.row_lengths(512);lens=M.batch_lengths(mix,4,100);out={'lens':lens}
ps=[p for p in pm.parameters() if p.requires_grad];opt=torch.optim.AdamW(ps,lr=1e-5);ev=[]
with forbid_spill(memory=mem):
  mem.empty_cache()
  for s in range(50):
    for k in range(2):
      n=lens[s*2+k];r0=mem.alloc_retries();ids=torch.randint(0,49152,(4,n),device='cuda')
      (pm(input_ids=ids,labels=ids,use_cache=False).loss/2).backward()
      ev.append((s,k,n,mem.alloc_retries()-r0,mem.memory_reserved() if hasattr(mem,'memory_reserved') else torch.cuda.memory_reserved()))
    r0=mem.alloc_retries();opt.step();opt.zero_grad(set_to_none=True);ev.append((s,-1,0,mem.alloc_retries()-r0,torch.cuda.memory_reserved()))
out['events']=ev;print('retries at',[e for e in ev if e[3]])
del opt;mem.empty_cache()
for name,L,ms in [('padded4',M.batch_lengths(mix,4,64),16),('padded4_64',M.batch_lengths(mix,4,64),64)]:
  st=ModelStep(pm);r=ramp(st,512,lengths=L,max_rows=256,memory=mem,mix_steps=ms)
  out[name]=[(g.rows,g.length,g.phase,g.verdict,g.retries,g.reserved_bytes) for g in r.rungs];out[name+'_kept']=r.micro_batch
  print(name,'kept',r.micro_batch,[(g.rows,g.length,g.verdict) for g in r.rungs if g.phase!='search' and g.verdict!='fits'])
  del st;mem.empty_cache()
json.dump(out,open(sys.argv[1],'w'))
PY
