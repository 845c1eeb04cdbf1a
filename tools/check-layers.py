#!/usr/bin/env python3
"""Checks the shape of src/: the module import graph and the size of files (and of
the bench crate's modules, bench/: rule 2; and of the kernels crate, kernels/: rules 2, 3
and 6).

Six rules, each violation printed on its own line:

1. Layers. Every top-level module of the crate sits in one layer of LAYERS below
   (highest first); a module may use its own layer and the layers below it, never a
   higher one. Nothing outside the table may exist: a new top-level module needs a
   place in it.
2. No cycles. At every folder (src/ included), the folder's children (files and
   sub-folders) and the `use` edges between them form a graph with no cycle. An edge
   between two files is counted at the folder that holds both: src/backend/host/a.rs
   using src/comm/b.rs is an edge backend -> comm at src/, and
   src/backend/host/a.rs using src/backend/nccl/mod.rs an edge host -> nccl at
   src/backend/. A folder's face (its mod.rs, or the foo.rs beside a folder foo/) is
   the folder itself: it may use its children and they may use it.
3. Size. No file under src/ is longer than --max-lines (default 800), not counting
   `#[cfg(test)]` items and files that are only a `#[cfg(test)] mod`, which are also
   left out of the graph (unit tests may build fixtures from any layer; they are not
   linked into the library).
4. Backends keep their insides. A file outside a backend's folder (each folder under
   src/backend/: host, ipc, nccl, staging) may use only that backend's face (its mod.rs), never
   a file inside it: what several backends share belongs in coll/ or in backend/
   itself, and a `pub use` at the face does not make an inner item shared (edges follow
   re-exports to the file that holds the item).
5. Map. README.md's layout table names every top-level file and folder of src/, and
   every src/ path it names exists.
6. Kernels below the library. The kernels crate (kernels/: the element types, the host
   reduction kernels, the CUDA kernel sources), which the library and the simulated GPU
   share, depends on no other crate of the workspace and names none in its code; in the
   library, only mem/ (and lib.rs, which re-exports `types`, the leaf every layer uses)
   names `ferroccl_kernels`: the rest reaches it through `crate::types` and `crate::mem`.

The bench crate (bench/main.rs and the modules it declares; bench/tests/ are its
integration tests, separate crates) has no layers; rule 2 holds there too, with main.rs
as the face of bench/.

Edges come from `use` declarations and from paths in code (`crate::a::b::f()`,
`super::x`, and paths through a name a `use` brought in), resolved to the file that
defines the module, following `pub use` re-exports of a folder's face to the file
that holds the item.

Usage: tools/check-layers.py [--root DIR] [--max-lines N] [--edges]
Exit status 0 when every rule holds, 1 otherwise.
"""

import argparse
import os
import re
import sys
from collections import defaultdict

# Highest first. A module may use its own layer and every layer after it; modules of
# one layer may use each other as long as no cycle forms. The order is src/lib.rs's
# (its module documentation lists the layers), with two decisions of ours: `ops` sits above
# `comm`, because a composite call runs collectives on a communicator (comm never
# names an op: a queued one is a closure); and `coll` (what a call is) sits above
# `transport` and `mem`, because a call names where its buffers live (a mem::Placement
# with its CUDA context) while moving bytes and managing memory need no notion of a call.
LAYERS = [
    # Entry points: the C surface (exported functions, handles, the panic boundary)
    # and the launcher's library half (ferroccl-run: starts ranks, serves rendezvous).
    ["ffi", "launch"],
    # Composite calls built from collectives: coalesced, axis, PreMulSum, local copies. Above
    # comm: each runs collectives on the communicator it is given.
    ["ops"],
    # Communicators: lifecycle, bootstrap, connecting the ranks, groups, the progress thread.
    ["comm"],
    # Executing collectives: the router, the host, device and NCCL backends.
    ["backend"],
    # What a call is: descriptors, validation, shape math.
    ["coll"],
    # Bytes between ranks (shared memory, in-process, TCP).
    ["transport"],
    # Memory kinds, the CUDA driver, copy and reduction kernels.
    ["mem"],
    # Leaves every layer may use: the error type, the environment registry, logging, OS
    # helpers, unit-test helpers. (`types`, the vocabulary types, is the kernels crate's,
    # re-exported at the root: rule 6.)
    ["error", "env", "log", "sys", "testing"],
]


def strip(text):
    """`text` with comments and the insides of string and char literals blanked
    (newlines kept, so line numbers hold)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := re.match(r'(?:b|c)?r(#*)"', text[i:i + 300])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + blank(text[i + 2:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('"' + blank(text[i + 1:j]) + '"')
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            m = re.match(r"'(\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'", text[i:i + 16])
            if m:
                out.append("' '")
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def item_end(code, i):
    """Index just past the item starting at `i`: its `;` or its matching `}`."""
    depth = 0
    n = len(code)
    while i < n:
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0 and c == "}":
                return i + 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return n


CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*(?:all\s*\(\s*)?test\b[^\]]*\]")


def drop_tests(code):
    """`code` with every `#[cfg(test)]` item blanked, the names of test modules
    declared as files (`#[cfg(test)] mod x;`), and the lines those items span."""
    test_files = []
    spanned = 0
    while True:
        m = CFG_TEST.search(code)
        if not m:
            return code, test_files, spanned
        j = m.end()
        # Further attributes on the same item.
        while True:
            k = re.match(r"\s*#\s*\[", code[j:])
            if not k:
                break
            j = item_end(code, j + k.end() - 1)
        decl = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", code[j:])
        if decl:
            test_files.append(decl.group(1))
        end = item_end(code, j)
        # item_end stops at the first `;` of a `fn`'s body when the body comes first.
        brace = code.find("{", j)
        semi = code.find(";", j)
        if brace >= 0 and (semi < 0 or brace < semi):
            end = item_end(code, brace)
        spanned += code.count("\n", m.start(), end) + 1
        code = code[: m.start()] + "".join(c if c == "\n" else " " for c in code[m.start():end]) + code[end:]


class Module:
    def __init__(self, path, file, face_of):
        self.path = path  # ("backend", "host", "engine")
        self.file = file  # "backend/host/engine.rs", relative to src/
        self.face_of = face_of  # the folder it is the face of ("backend/host"), or None
        self.code = ""
        self.children = set()  # names of child modules declared here
        self.aliases = {}  # local name -> absolute module path (tuple)
        self.reexports = {}  # name -> absolute path of the item (tuple)
        self.use_spans = []


def load(src, root="lib", skip=("bin/",)):
    """Every module file under src/ (the library crate only), keyed by module path;
    `root` names the crate root's file, files under `skip` belong to other crates."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, src).replace(os.sep, "/")
            with open(full, encoding="utf-8") as fh:
                text = fh.read()
            code, test_files, _ = drop_tests(strip(text))
            if rel.startswith(skip):
                continue  # separate crates: they use `ferroccl::`, not `crate::`
            parts = rel[:-3].split("/")
            if parts == [root]:
                path, face = (), ""
            elif parts[-1] == "mod":
                path, face = tuple(parts[:-1]), "/".join(parts[:-1])
            else:
                path = tuple(parts)
                face = rel[:-3] if os.path.isdir(os.path.join(src, rel[:-3])) else None
            m = Module(path, rel, face)
            m.code = code
            m.test_files = test_files
            mods[path] = m
    # Files that are only test modules (`#[cfg(test)] mod x;`) are not part of the library.
    for m in list(mods.values()):
        for t in m.test_files:
            gone = mods.pop(m.path + (t,), None)
            if gone is not None:
                TEST_FILES.add(gone.file)
    return mods


# Files under src/ that hold only a `#[cfg(test)] mod` (filled by `load`): not library
# code, so no size limit either.
TEST_FILES = set()


def code_lines(text):
    """Lines of `text` outside #[cfg(test)] items."""
    return len(text.splitlines()) - drop_tests(strip(text))[2]


USE = re.compile(r"\b(?:pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]*);")


def use_tree(tree, prefix=()):
    """The (path, local name, is_glob) leaves of a use tree."""
    tree = tree.strip()
    out = []
    depth, start, parts = 0, 0, []
    if "{" not in tree:
        m = re.fullmatch(r"([\w:]+?)(?:\s+as\s+(\w+))?", re.sub(r"\s+", " ", tree).replace(" :: ", "::").replace(":: ", "::").replace(" ::", "::"))
        if not m:
            return out
        path = prefix + tuple(p for p in m.group(1).split("::") if p)
        if path and path[-1] == "*":
            out.append((path[:-1], None, True))
        elif path and path[-1] == "self":
            out.append((path[:-1], m.group(2) or path[-2], False))
        elif path:
            out.append((path, m.group(2) or path[-1], False))
        return out
    head, _, rest = tree.partition("{")
    head = tuple(p for p in re.sub(r"\s+", "", head).split("::") if p)
    body = rest[: rest.rfind("}")]
    for i, c in enumerate(body):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    for p in parts:
        if p.strip():
            out.extend(use_tree(p, prefix + head))
    return out


def absolute(mod, path):
    """`path` as written in `mod`, made absolute (a tuple from the crate root), or None
    for paths outside the crate."""
    if not path:
        return None
    head = path[0]
    here = mod.path
    if head == "crate":
        return path[1:]
    if head in ("super", "self"):
        base = here
        rest = list(path)
        while rest and rest[0] in ("super", "self"):
            if rest.pop(0) == "super":
                base = base[:-1]
        return tuple(base) + tuple(rest)
    if head in mod.aliases:
        return mod.aliases[head] + path[1:]
    if head in mod.children:
        return here + path
    return None


def parse(mods):
    for m in mods.values():
        m.children = set(re.findall(r"\bmod\s+(\w+)\s*[;{]", m.code))
    for m in mods.values():
        for u in USE.finditer(m.code):
            m.use_spans.append(u.span())
            public = u.group(0).lstrip().startswith("pub")
            for path, name, glob in use_tree(u.group(1)):
                a = absolute(m, path)
                if a is None:
                    continue
                if not glob and name and name != "_":
                    m.aliases[name] = a
                    if public:
                        m.reexports[name] = a


def resolve(mods, path, seen=None):
    """The module file that defines what the absolute `path` names."""
    seen = seen or set()
    best = None
    for k in range(len(path), -1, -1):
        if path[:k] in mods:
            best = k
            break
    if best is None:
        return None
    m = mods[path[:best]]
    rest = path[best:]
    if rest and rest[0] in m.reexports and (m.path, rest[0]) not in seen:
        seen.add((m.path, rest[0]))
        target = m.reexports[rest[0]] + rest[1:]
        r = resolve(mods, target, seen)
        if r is not None:
            return r
    return m


PATH = re.compile(r"(?<![\w:])((?:[A-Za-z_]\w*)(?:\s*::\s*[A-Za-z_]\w*)+)")


def edges(mods):
    """{(from file, to file): first line} over the library's modules."""
    out = {}
    for m in mods.values():
        spans = []
        for s, e in m.use_spans:
            body = m.code[s:e]
            u = USE.match(body) or USE.search(body)
            for path, _, _ in use_tree(u.group(1)):
                spans.append((s, path))
        for p in PATH.finditer(m.code):
            if any(s <= p.start() < e for s, e in m.use_spans):
                continue
            spans.append((p.start(), tuple(re.sub(r"\s+", "", p.group(1)).split("::"))))
        for pos, path in spans:
            a = absolute(m, path)
            if a is None:
                continue
            t = resolve(mods, a)
            if t is None or t is m:
                continue
            line = m.code.count("\n", 0, pos) + 1
            key = (m.file, t.file)
            if key not in out or out[key] > line:
                out[key] = line
    return out


def folder_of(mod):
    """The folder a module's file lives in, as a path tuple (its parent module)."""
    return mod.path[:-1]


def node_at(mod, level):
    """The child of folder `level` that holds `mod`, or None when `mod` is the face
    of `level` (or outside it)."""
    if mod.path[: len(level)] != level or len(mod.path) == len(level):
        return None
    return mod.path[len(level)]


def sccs(nodes, adj):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def shortest_cycle(start, adj, within):
    """The shortest cycle through `start` using nodes of `within`, as a node list."""
    prev = {start: None}
    queue = [start]
    for v in queue:
        for w in sorted(adj.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1]
            if w in within and w not in prev:
                prev[w] = v
                queue.append(w)
    return [start]


def cycles(mods, es, by_file, layer, top):
    """Rule 2 over one crate's modules (`top`: its folder, for messages); returns the
    number of cycles printed."""
    problems = 0
    levels = {()} | {m.path[:-1] for m in mods.values() if m.path} | {m.path for m in mods.values() if m.face_of is not None}
    for level in sorted(levels):
        adj = defaultdict(set)
        witness = {}
        for (a, b), line in sorted(es.items()):
            ma, mb = by_file[a], by_file[b]
            na, nb = node_at(ma, level), node_at(mb, level)
            if na is None or nb is None or na == nb:
                continue
            if not level and layer.get(nb, -1) < layer.get(na, -1):
                continue
            adj[na].add(nb)
            witness.setdefault((na, nb), f"{top}{a}:{line} uses {top}{b}")
        where = top + "".join(p + "/" for p in level)
        for comp in sccs(set(adj) | {w for v in adj.values() for w in v}, adj):
            if len(comp) < 2:
                continue
            cyc = shortest_cycle(min(comp), adj, set(comp))
            print(f"cycle in {where}: {' -> '.join(cyc + [cyc[0]])}")
            for x, y in zip(cyc, cyc[1:] + cyc[:1]):
                print(f"    {x} -> {y}: {witness[(x, y)]}")
            rest = sorted(set(comp) - set(cyc))
            if rest:
                print(f"    (the same knot also holds {', '.join(rest)}: rerun once this cycle is cut)")
            problems += 1
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--max-lines", type=int, default=800)
    ap.add_argument("--edges", action="store_true", help="print every edge between top-level modules")
    args = ap.parse_args()
    src = os.path.join(args.root, "src")
    mods = load(src)
    parse(mods)
    es = edges(mods)
    by_file = {m.file: m for m in mods.values()}
    problems = 0

    # 1. Layers.
    layer = {}
    for i, names in enumerate(LAYERS):
        for name in names:
            layer[name] = i
    for m in sorted(mods.values(), key=lambda m: m.file):
        if len(m.path) >= 1 and m.path[0] not in layer and m.path[0] != "lib":
            print(f"unplaced: src/{m.file}: top-level module `{m.path[0]}` has no layer in tools/check-layers.py")
            problems += 1
    for (a, b), line in sorted(es.items()):
        ma, mb = by_file[a], by_file[b]
        if not ma.path or not mb.path:
            continue
        la, lb = layer.get(ma.path[0]), layer.get(mb.path[0])
        if la is None or lb is None or ma.path[0] == mb.path[0]:
            continue
        if args.edges:
            print(f"edge: {ma.path[0]} -> {mb.path[0]}: src/{a}:{line} uses src/{b}")
        if lb < la:
            print(f"upward: src/{a}:{line} ({ma.path[0]}) uses src/{b} ({mb.path[0]}, a higher layer)")
            problems += 1

    # 2. Cycles at every folder. At src/ an upward edge (reported above) is left out:
    # every cycle between layers runs through one.
    problems += cycles(mods, es, by_file, layer, "src/")

    # 3. Size.
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith(".rs"):
                full = os.path.join(dirpath, f)
                if os.path.relpath(full, src).replace(os.sep, "/") in TEST_FILES:
                    continue
                with open(full, encoding="utf-8") as fh:
                    n = code_lines(fh.read())
                if n > args.max_lines:
                    rel = os.path.relpath(full, args.root)
                    print(f"long: {rel}: {n} lines outside #[cfg(test)] (limit {args.max_lines})")
                    problems += 1

    # 4. Backends keep their insides.
    backends = sorted({m.path[:2] for m in mods.values() if len(m.path) >= 3 and m.path[0] == "backend"})
    for (a, b), line in sorted(es.items()):
        ma, mb = by_file[a], by_file[b]
        for f in backends:
            inside_b = mb.path[: len(f)] == f and len(mb.path) > len(f)
            inside_a = ma.path[: len(f)] == f
            if inside_b and not inside_a:
                print(f"private: src/{a}:{line} uses src/{b}, inside {'::'.join(f)}; use that backend's face (src/{'/'.join(f)}/mod.rs) or move what is shared to coll/ or backend/")
                problems += 1

    # 2 for the bench crate.
    bench = os.path.join(args.root, "bench")
    nbench = 0
    if os.path.exists(os.path.join(bench, "main.rs")):
        bmods = load(bench, root="main", skip=("tests/",))
        parse(bmods)
        bes = edges(bmods)
        problems += cycles(bmods, bes, {m.file: m for m in bmods.values()}, {}, "bench/")
        nbench = len(bmods)

    # 2, 3 and 6 for the kernels crate.
    kernels = os.path.join(args.root, "kernels")
    nkernels = 0
    if os.path.exists(os.path.join(kernels, "src", "lib.rs")):
        kmods = load(os.path.join(kernels, "src"))
        parse(kmods)
        kes = edges(kmods)
        problems += cycles(kmods, kes, {m.file: m for m in kmods.values()}, {}, "kernels/src/")
        nkernels = len(kmods)
        for m in sorted(kmods.values(), key=lambda m: m.file):
            n = code_lines(open(os.path.join(kernels, "src", m.file), encoding="utf-8").read())
            if n > args.max_lines:
                print(f"long: kernels/src/{m.file}: {n} lines outside #[cfg(test)] (limit {args.max_lines})")
                problems += 1
            for w in re.finditer(r"\b(ferroccl(?:_simgpu|_nccl|_bench)?)\s*::", m.code):
                line = m.code.count("\n", 0, w.start()) + 1
                print(f"above: kernels/src/{m.file}:{line} names `{w.group(1)}`; the kernels crate depends on no other crate of the workspace")
                problems += 1
        with open(os.path.join(kernels, "Cargo.toml"), encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if re.match(r"\s*ferroccl(?:-simgpu|-nccl|-bench)?\s*=", line):
                    print(f"above: kernels/Cargo.toml:{i} depends on {line.split('=')[0].strip()}; the kernels crate depends on no other crate of the workspace")
                    problems += 1
    for m in sorted(mods.values(), key=lambda m: m.file):
        if m.file == "lib.rs" or m.file.startswith("mem/"):
            continue
        w = re.search(r"\bferroccl_kernels\b", m.code)
        if w:
            line = m.code.count("\n", 0, w.start()) + 1
            print(f"kernels: src/{m.file}:{line} names `ferroccl_kernels`; use `crate::types` or `crate::mem::reduce`/`crate::mem::cuda_kernels` (only mem/ uses the kernels crate)")
            problems += 1

    # 5. The README's layout table names every top-level entry of src/ (and each path
    # it names under src/ exists), so the map readers start from matches the tree.
    readme = os.path.join(args.root, "README.md")
    if os.path.exists(readme):
        with open(readme, encoding="utf-8") as fh:
            text = fh.read()
        table = text.split("## Layout", 1)[1].split("\n## ", 1)[0] if "## Layout" in text else ""
        named = set(re.findall(r"`(src/[A-Za-z0-9_./-]+)`", table))
        for entry in sorted(os.listdir(src)):
            if entry in ("lib.rs", "bin"):
                continue
            path = "src/" + entry + ("/" if os.path.isdir(os.path.join(src, entry)) else "")
            if not any(n == path or n.startswith(path) or n == path.rstrip("/") for n in named):
                print(f"unmapped: {path} is not in README.md's layout table")
                problems += 1
        for n in sorted(named):
            if not os.path.exists(os.path.join(args.root, n)):
                print(f"stale: README.md's layout table names {n}, which does not exist")
                problems += 1

    if problems:
        print(f"check-layers: {problems} problem(s)")
        return 1
    print(
        f"check-layers: {len(mods)} modules, {len(es)} edges: layers hold, no cycles, backends keep their insides, "
        f"no file over {args.max_lines} lines, README layout table matches; bench: {nbench} modules, no cycles; "
        f"kernels: {nkernels} modules, no cycles, below the library"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
