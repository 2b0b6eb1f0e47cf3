import subprocess as S,time,os,json,pwd,sys
import gpu_facts_collect as G,sglang_server_host as H,nvidia_smi_parse as P
C={};U='sglang-server.service';T=time.monotonic;Q=G.commands()
def sh(a):r=S.run(a,capture_output=True,text=True);return r.stdout+r.stderr
def rd(p):
 try:return open(p,'rb').read().decode('utf-8','replace')
 except OSError as e:return repr(e)
N=['nvidia-smi','--format=csv,noheader,nounits'];HG=N+['--query-gpu=index,uuid,memory.used'];HA=N+['--query-compute-apps=pid,gpu_uuid,used_memory,process_name']
def V():return {'summary':sh(['nvidia-smi']),'gf_apps':sh(Q['query_apps']),'h_gpu':sh(HG),'h_apps':sh(HA)}
def R():
 g=H.gpu_state();o,f=H.classify_gpu_processes(g['processes'],U);rows=P.parse_csv_query(sh(Q['query_apps']),header=False,fields=G.APP_FIELDS)
 return {'gpu_state':g,'ours':o,'foreign':f,'text':H.describe_processes(f),'gf':G.build_processes(rows,[{'index':k,'uuid':v['uuid']} for k,v in g['gpus'].items()])}
C['env']={x:sh(x.split()) for x in('uname -a','nvidia-smi -L','id intruder',' '.join(Q['query_gpu']))}
C['before']=V();C['before_roles']=R();u=pwd.getpwnam('intruder')
HC=json.loads(os.environ.get('HC','0')) or [sys.executable,'-c',"import torch,time;x=torch.ones(5<<30,device='cuda');torch.cuda.synchronize();print('ready',flush=True);time.sleep(900)"]
for n,sig in (('kill1',9),('kill2',9),('term',15)):
 p=S.Popen(HC,user=u.pw_uid,group=u.pw_gid,extra_groups=[],cwd='/tmp',env=dict(os.environ,HOME='/tmp'),stdout=S.PIPE,stderr=open('/tmp/e','a'),text=True)
 t=T();d={'ready':p.stdout.readline(),'ready_s':round(T()-t,2),'pid':p.pid,'held':V(),'roles':R()}
 for f in('status','cmdline','cgroup'):d[f]=rd(f'/proc/{p.pid}/{f}')
 k=T();p.send_signal(sig)
 if n=='kill2':
  tl=d['timeline']=[]
  while T()-k<30:
   a=sh(HA);g=sh(HG);tl.append([round(T()-k,3),p.poll(),a,g])
   if str(p.pid) not in a and p.poll() is not None and all(int(l.split(',')[2])<512 for l in g.splitlines()):break
 else:s,w=H.wait_released(U,[],60,512,0.05);d['wait']=[w,s['released'],s['gpu_memory_used_mib'],round(T()-k,3)]
 p.wait();d['rc']=p.returncode;d['after']=V();d['after_roles']=R();C[n]=d;print(n,d['pid'],d['rc'],d['ready'],d.get('wait'),d['roles']['text'])
C['stderr']=rd('/tmp/e');json.dump(C,open(os.environ['OUT']+'/captures.json','w'),indent=1,default=str)
