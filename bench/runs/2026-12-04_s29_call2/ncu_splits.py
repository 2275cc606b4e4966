import csv, sys, collections
src, n = sys.argv[1], int(sys.argv[2])
rows = [l for l in open(src) if l.startswith('"')]
by = collections.OrderedDict()
for x in csv.DictReader(rows):
    by.setdefault((x["ID"], x["Kernel Name"]), {})[x["Metric Name"]] = x["Metric Value"]
items = list(by.items())
start = [i for i, (k, _) in enumerate(items) if "embed_token" in k[1]][-1]
print("# the last decode step's first %d kernels and its last 3 (ncu launch metrics): split KB, static / dynamic "
      "shared memory a block, registers, blocks an SM allowed by shared memory / registers, grid x block" % n)
for (i, name), m in items[start:start + n] + items[-3:]:
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "").replace("unnamed>::", "").replace("void ", "").split("(")[0]
    kb = int(m["launch__shared_mem_config_size"].replace(",", "")) // 1024
    print(f"{name[:48]:48s} split {kb:3d} KB  smem {m['launch__shared_mem_per_block_static']}/{m['launch__shared_mem_per_block_dynamic']}  "
          f"regs {m['launch__registers_per_thread']}  occ {m['launch__occupancy_limit_shared_mem']}/{m['launch__occupancy_limit_registers']}  "
          f"grid {m['launch__grid_size']} x {m['launch__block_size']}")
