import subprocess, sys
def test_repro(redis_cluster):
    for mode in ("cold", "warm", "plain"):
        out = subprocess.run([sys.executable, "/tmp/clusterrepro.py", str(redis_cluster[0]), mode], capture_output=True, text=True)
        print(out.stdout, out.stderr[-500:])
