#!/usr/bin/env python3
"""Checks the shape rules of the Rust crates that no compiler checks:

- no import cycle between the top-level modules of a crate (`crate::a` used in `b` and
  `crate::b` used in `a`, directly or through others);
- no production function over 100 lines, and none over 70 without a comment just above it
  that says why it stays whole (a plain `//` comment between its doc and its signature).

Test modules (`#[cfg(test)] mod ...` to the end of a file), `tests.rs` files and the crates'
tests/, benches/ and examples/ are not production code. Lines are counted from `fn` to the
closing brace. Exits 1 and names each breach.

    python3 scripts/structure.py [crates-dir]
"""
import os
import re
import sys

FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')
LONG, TOO_LONG = 70, 100


def code_of(line):
    """The line without string and char literals and line comments (enough to count braces)."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    at = line.find('//')
    return line[:at] if at >= 0 else line


def production_lines(path):
    lines = open(path, encoding='utf-8').read().split('\n')
    if os.path.basename(path) == 'tests.rs':
        return []
    for i, line in enumerate(lines):
        if line.startswith('#[cfg(test)]') and i + 1 < len(lines) and lines[i + 1].startswith('mod '):
            return lines[:i]
    return lines


def source_files(src):
    for d, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith('.rs'):
                yield os.path.join(d, f)


def long_functions(src):
    for path in source_files(src):
        lines = production_lines(path)
        for i, line in enumerate(lines):
            m = FN.match(line)
            if not m:
                continue
            depth, started, j = 0, False, i
            while j < len(lines):
                code = code_of(lines[j])
                if not started and ';' in code and '{' not in code:
                    break
                for c in code:
                    if c == '{':
                        depth, started = depth + 1, True
                    elif c == '}':
                        depth -= 1
                if started and depth == 0:
                    break
                j += 1
            if not started:
                continue
            n = j - i + 1
            if n <= LONG:
                continue
            above = []
            k = i - 1
            while k >= 0 and re.match(r'\s*(///?|#\[)', lines[k]):
                above.append(lines[k])
                k -= 1
            # A plain comment between the doc and the signature says why it stays whole.
            justified = any(
                a.strip().startswith('//') and not a.strip().startswith('///') or 'whole' in a
                for a in above
            )
            if n > TOO_LONG:
                yield f'{path}:{i + 1}: fn {m.group(7)} is {n} lines (at most {TOO_LONG})'
            elif not justified:
                yield f'{path}:{i + 1}: fn {m.group(7)} is {n} lines: over {LONG}, say above it why it stays whole'


def module_graph(src):
    modules = {}
    for entry in os.listdir(src):
        path = os.path.join(src, entry)
        if entry.endswith('.rs') and entry not in ('lib.rs', 'main.rs'):
            modules.setdefault(entry[:-3], []).append(path)
        elif os.path.isdir(path):
            modules.setdefault(entry, []).extend(source_files(path))
    names = '|'.join(sorted(modules, key=len, reverse=True))
    graph = {m: set() for m in modules}
    if not names:
        return graph
    direct = re.compile(r'crate::(%s)\b' % names)
    grouped = re.compile(r'use crate::\{([^;]*)\}', re.S)
    for module, paths in modules.items():
        for path in paths:
            text = re.sub(r'//[^\n]*', '', '\n'.join(production_lines(path)))
            graph[module].update(direct.findall(text))
            for group in grouped.findall(text):
                graph[module].update(re.findall(r'(?:^|[,{\s])(%s)\b' % names, group))
        graph[module].discard(module)
    return graph


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(n):
        index[n] = low[n] = counter[0]
        counter[0] += 1
        stack.append(n)
        on.add(n)
        for w in graph.get(n, ()):
            if w not in index:
                visit(w)
                low[n] = min(low[n], low[w])
            elif w in on:
                low[n] = min(low[n], index[w])
        if low[n] == index[n]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == n:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for n in sorted(graph):
        if n not in index:
            visit(n)
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else 'crates'
    problems = []
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, 'src')
        if not os.path.isdir(src):
            continue
        graph = module_graph(src)
        for component in cycles(graph):
            edges = '; '.join(f'{m} -> {", ".join(sorted(graph[m] & set(component)))}' for m in component)
            problems.append(f'{crate}: import cycle among {", ".join(component)} ({edges})')
        problems.extend(long_functions(src))
    for p in problems:
        print(p)
    if problems:
        print(f'{len(problems)} structure problems', file=sys.stderr)
        sys.exit(1)
    print('structure: no import cycle, no function over the limits')


if __name__ == '__main__':
    main()
