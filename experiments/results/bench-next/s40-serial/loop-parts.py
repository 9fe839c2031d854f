"""Within the commit loop's samples (perf script --no-inline), which callee each sample is in:
the first marker (in order) found in the stack. Prints share of the loop's samples."""
import re, sys
LOOP = "baton::work::sequencer::commit_loop::"
MARKERS = [
    ("intake take", "baton::work::sequencer::Intake::take"),
    ("answers handed to homes (spawn)", "baton::work::sequencer::HomeAnswers::deliver"),
    ("set_committed_seq", "baton::leadership::Leadership::set_committed_seq"),
    ("send_commit (encode, hand to connection)", "baton::work::fence::SeqPipe::send_commit"),
    ("judge (row to verdict)", "baton::work::fence::Fence::judge"),
    ("answer bound (timeout)", "baton::pg::answered_within"),
    ("tokio-postgres query/response", "tokio_postgres::"),
    ("histograms", "metrics"),
    ("timer", "tokio::runtime::time"),
    ("malloc/free", "malloc"),
    ("malloc/free", "free"),
    ("malloc/free", "mi_"),
]
counts, loop_total = {}, 0
for block in open(sys.argv[1]).read().split("\n\n"):
    lines = [l.strip() for l in block.strip().split("\n")]
    if len(lines) < 2:
        continue
    frames = [re.sub(r"^[0-9a-f]+ (.*?)\+0x[0-9a-f]+ \(.*$", r"\1", l) for l in lines[1:]]
    if not any(f.startswith(LOOP) or f.startswith("<" + LOOP) for f in frames):
        continue
    loop_total += 1
    # frames below (callees of) the loop's frame
    k = next(i for i, f in enumerate(frames) if f.startswith(LOOP) or f.startswith("<" + LOOP))
    inner = frames[:k]
    name = "the loop itself / other"
    for n, m in MARKERS:
        if any(m in f for f in inner):
            name = n
            break
    counts[name] = counts.get(name, 0) + 1
print(f"commit loop samples: {loop_total}")
for n, c in sorted(counts.items(), key=lambda x: -x[1]):
    print(f"  {n}: {c} ({100.0 * c / loop_total:.0f}%)")
