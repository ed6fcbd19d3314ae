"""Image helpers for tests/e2e_*.sh: make inputs, check mitaseg's outputs.

Usage: e2e_images.py COMMAND ARGS... (see the branches below); a failed check
raises, so the exit status is non-zero."""
import json, struct, sys, os, glob
import numpy as np
from PIL import Image

def st_read(path, with_data=True):
    """A safetensors file's header (dict) and, when asked, its data bytes."""
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        head = json.loads(f.read(n))
        return head, (f.read() if with_data else None)

def model_cfg(path):
    return json.loads(st_read(path, False)[0]['__metadata__']['config'])

def img(path, w, h, seed, mode='RGB'):
    r = np.random.default_rng(seed)
    # blocks of colour, so any model sees structure
    small = r.integers(0, 256, (max(1, h // 8), max(1, w // 8), 3), dtype=np.uint8)
    a = np.kron(small, np.ones((8, 8, 1), np.uint8))[:h, :w]
    a = np.pad(a, ((0, h - a.shape[0]), (0, w - a.shape[1]), (0, 0)), mode='edge')
    im = Image.fromarray(a, 'RGB').convert(mode)
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    im.save(path)

def read_dump(path):
    head, data = st_read(path)
    out = {}
    dt = {'F32': np.float32, 'U8': np.uint8, 'I32': np.int32}
    for k, v in head.items():
        if k == '__metadata__':
            continue
        a, b = v['data_offsets']
        out[k] = np.frombuffer(data[a:b], dt[v['dtype']]).reshape(v['shape'])
    return out

cmd, args = sys.argv[1], sys.argv[2:]
if cmd == 'img':                      # img PATH W H SEED [MODE]
    img(args[0], int(args[1]), int(args[2]), int(args[3]), *(args[4:5] or ['RGB']))
elif cmd == 'index_ok':               # index_ok MASK.png INPUT MODEL: P mode, size, palette
    m = Image.open(args[0]); i = Image.open(args[1]); cfg = model_cfg(args[2])
    assert m.mode == 'P', m.mode
    assert m.size == i.size, (m.size, i.size)
    pal = np.array(m.getpalette()[:3 * len(cfg['palette'])]).reshape(-1, 3)
    assert (pal == np.array(cfg['palette'])).all(), 'palette differs from the model'
    assert np.array(m).max() < len(cfg['classes'])
elif cmd == 'same_ids':               # same_ids A.png B.png: equal class ids
    a = np.array(Image.open(args[0])); b = np.array(Image.open(args[1]))
    assert a.shape == b.shape and (a == b).all(), 'ids differ'
elif cmd == 'label_ok':               # label_ok LABEL.png INDEX.png
    l = Image.open(args[0]); assert l.mode == 'L', l.mode
    assert (np.array(l) == np.array(Image.open(args[1]))).all()
elif cmd == 'color_ok':               # color_ok COLOR.png INDEX.png MODEL
    c = Image.open(args[0]); assert c.mode == 'RGB', c.mode
    pal = np.array(model_cfg(args[2])['palette'], np.uint8)
    assert (np.array(c) == pal[np.array(Image.open(args[1]))]).all()
elif cmd == 'overlay_ok':             # overlay_ok OVERLAY.png INPUT.png INDEX.png MODEL
    o = np.array(Image.open(args[0])).astype(int); i = np.array(Image.open(args[1]).convert('RGB')).astype(int)
    pal = np.array(model_cfg(args[3])['palette'], int)
    want = (i + pal[np.array(Image.open(args[2]))] + 1) // 2
    assert (o == want).all(), 'overlay is not a 50% blend'
elif cmd == 'dump_ok':                # dump_ok DUMP MASK.png MODEL
    d = read_dump(args[0]); m = np.array(Image.open(args[1])); cfg = model_cfg(args[2])
    C = len(cfg['classes'])
    assert d['logits'].shape == (C,) + m.shape, d['logits'].shape
    assert (d['mask'] == m).all(), 'dump mask != PNG'
    # argmax of the logits, ties aside (top two within 1e-6 of each other)
    top2 = np.sort(d['logits'], axis=0)[-2:]
    clear = (top2[1] - top2[0]) > 1e-6
    assert (d['logits'].argmax(0)[clear] == m[clear]).all(), 'mask != argmax(logits)'
    if cfg['backbone'].get('attention', {}).get('type', 'mita') == 'mita':
        assert any(k.startswith('layers.') and k.endswith('.topk_idx') for k in d), sorted(d)
        assert any(k.startswith('layers.') and k.endswith('.route') for k in d), sorted(d)
elif cmd == 'dump_geometry':          # dump_geometry DUMP RHxRW: working size and token grid in the metadata
    meta = st_read(args[0], False)[0]['__metadata__']
    assert meta['working_size'] == args[1], meta
    hp, wp = map(int, meta['token_grid'].split('x'))
    routes = [v for k, v in read_dump(args[0]).items() if k.endswith('.route')]
    assert routes and routes[0].shape[1] in (hp * wp, hp * wp + 1), (meta, routes[0].shape)
elif cmd == 'dumps_same':             # dumps_same A B 1|0: every tensor bit-equal (1), or the logits differ (0)
    a, b = read_dump(args[0]), read_dump(args[1])
    if args[2] == '1':
        assert sorted(a) == sorted(b), (sorted(a), sorted(b))
        for k in a:
            assert a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes(), k
    else:
        assert a['logits'].shape != b['logits'].shape or not np.array_equal(a['logits'], b['logits'])
elif cmd == 'decodes':                # decodes FILE...: every file is a complete image
    for p in args:
        with Image.open(p) as im:
            im.load()
elif cmd == 'truncate':               # truncate SRC DST BYTES
    data = open(args[0], 'rb').read()
    open(args[1], 'wb').write(data[:int(args[2])])
elif cmd == 'labels':                 # labels PRED.png OUT_SAME OUT_SHIFT OUT_MIX MODEL: -> expected JSON
    p = np.array(Image.open(args[0])); cfg = model_cfg(args[4]); C = len(cfg['classes'])
    ign = cfg.get('ignore_index')
    Image.fromarray(p.astype(np.uint8), 'L').save(args[1])
    Image.fromarray(((p + 1) % C).astype(np.uint8), 'L').save(args[2])
    mix = p.copy().astype(np.uint8)
    h = mix.shape[0]
    mix[h // 2:] = (mix[h // 2:] + 1) % C            # bottom half wrong
    if ign is not None:
        mix[:, :3] = ign                              # left columns ignored
    Image.fromarray(mix, 'L').save(args[3])
    # expected metrics of (label = mix, prediction = p), computed here independently
    keep = mix != (ign if ign is not None else -1)
    l, q = mix[keep].astype(int), p[keep].astype(int)
    cm = np.zeros((C, C), np.int64)
    np.add.at(cm, (l, q), 1)
    tp = np.diag(cm); lab = cm.sum(1); pre = cm.sum(0); uni = lab + pre - tp
    miou = (tp[uni > 0] / uni[uni > 0]).mean() * 100
    macc = (tp[lab > 0] / lab[lab > 0]).mean() * 100
    aacc = tp.sum() / cm.sum() * 100
    print(json.dumps({'mIoU': miou, 'mAcc': macc, 'aAcc': aacc, 'confusion': cm.tolist()}))
elif cmd == 'confusion_diag':         # confusion_diag OUT.txt: eval --confusion, own masks
    lines = open(args[0]).read().split('\n')
    at = [i for i, l in enumerate(lines) if l.startswith('confusion:')]
    assert len(at) == 1, 'no confusion header'
    cols = lines[at[0] + 1].split()
    assert cols[-1] == 'pred/label' and cols[:-1] == [str(i) for i in range(len(cols) - 1)], cols
    rows = lines[at[0] + 2:at[0] + 2 + len(cols) - 1]
    seen = 0
    for i, l in enumerate(rows):
        cells = l.split()
        assert cells[0] == str(i), l
        vals = cells[-len(cols):]                 # the names may hold spaces
        if vals[-1] == '-':
            assert set(vals) == {'-'}, l
            continue
        seen += 1
        assert vals[i] == '100.0' and vals[-1] == '1.00', l
        assert all(v == '.' for j, v in enumerate(vals[:-1]) if j != i), l
    assert seen > 0, 'no labelled class'
elif cmd == 'json_get':               # json_get FILE KEY: prints the value
    print(json.load(open(args[0]))[args[1]])
elif cmd == 'json_close':             # json_close A.json EXPECTED_JSON_STRING
    a = json.load(open(args[0])); b = json.loads(args[1])
    for k, v in b.items():
        if isinstance(v, list):                    # a matrix of counts: exact
            assert a[k] == v, (k, a[k], v)
        else:
            assert abs(a[k] - v) < 1e-3, (k, a[k], v)
elif cmd == 'recfg':                  # recfg SRC DST JSON_PATCH: SRC with config keys replaced
    head, data = st_read(args[0])
    cfg = json.loads(head['__metadata__']['config'])
    for path, v in json.loads(args[2]).items():   # "input.short_side": null
        d = cfg
        keys = path.split('.')
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = v
    head['__metadata__']['config'] = json.dumps(cfg)
    h = json.dumps(head).encode()
    h += b' ' * (-len(h) % 8)
    with open(args[1], 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + data)
elif cmd == 'json_get_cfg':           # json_get_cfg MODEL KEY.PATH: prints a model config value (null: native)
    v = model_cfg(args[0])
    for k in args[1].split('.'):
        v = v.get(k) if isinstance(v, dict) else None
    print('native' if v in (None, 0) else v)
elif cmd == 'temp_name':              # temp_name PID SEQ [BOOT]: mitaseg's temp file name on this host
    import socket
    def fnv1a(b):
        h = 2166136261
        for c in b:
            h = ((h ^ c) * 16777619) & 0xffffffff
        return h
    try:
        boot = fnv1a(open('/proc/sys/kernel/random/boot_id', 'rb').read().strip()) or 1
    except OSError:
        boot = 0
    if len(args) > 2:
        boot = int(args[2], 16)
    print('.mitaseg-%08x-%08x-%s-%s.tmp' % (fnv1a(socket.gethostname().encode()), boot, args[0], args[1]))
elif cmd == 'sigrun':                 # sigrun SIG DELAY LIMIT CMD...: CMD must end by exit(128+SIG) within LIMIT s of SIG
    import signal, subprocess, time
    sig = getattr(signal, 'SIG' + args[0]); delay = float(args[1]); limit = float(args[2])
    p = subprocess.Popen(args[3:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    if p.poll() is not None:
        sys.exit('finished (%d) before the signal' % p.returncode)
    p.send_signal(sig); t = time.monotonic()
    try:
        rc = p.wait(limit)
    except subprocess.TimeoutExpired:
        p.kill(); p.wait()
        sys.exit('still running %.1f s after SIG%s' % (limit, args[0]))
    print('exit %d %.2f s after SIG%s' % (rc, time.monotonic() - t, args[0]))
    # a negative code is a death by the signal: no clean-up ran
    assert rc == 128 + sig, 'expected exit %d, got %d' % (128 + sig, rc)
else:
    sys.exit('unknown helper ' + cmd)
