// The fleet page (GET /ui): polls this node's GET /ui/fleet every second and renders it.
//
// Every string from the server goes into the page as text (textContent, dataset), never as
// markup. The rendered rows carry data attributes (data-leader, data-member, data-up, data-role)
// so tools and tests read the page without parsing its wording. A member the spent failure
// budget keeps from campaigning has role budget_blocked; while any reachable member says the
// budget is spent, the page says so (#budget, body data-budget="spent").
//
// Leadership changes are what this page saw between two polls (a leader or token that differs
// from the previous poll's), kept in memory since it opened: a change that came and went
// within one poll is not seen. Fence rejections are the resource's own record.
'use strict';

const POLL_EVERY_MS = 1000;
// A poll that takes longer is abandoned: the node is shown as not answering.
const POLL_TIMEOUT_MS = 3000;
const CHANGES_KEPT = 30;

const page = {
  polls: 0,
  // Per shard, the leader seen at the previous poll: {id, token, source}, or null.
  lastLeaders: null,
  // Newest last.
  changes: [],
  // The longest lease time left seen so far: the bars' full width.
  leaseScaleMs: 1,
};

function el(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (className) e.className = className;
  return e;
}

function row(cells) {
  const tr = document.createElement('tr');
  for (const c of cells) tr.append(c instanceof Node ? c : el('td', c));
  return tr;
}

function clock(ms) {
  const d = new Date(ms);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, '0')).join(':');
}

function dash(v) {
  return v === null || v === undefined ? '—' : v;
}

// A member's terms, one per shard: a sharded node lists them under `shards`, an unsharded one
// has its one term at the top level.
function termsOf(status) {
  if (Array.isArray(status.shards)) {
    return status.shards.map((s) => ({
      shard: s.shard, role: s.role, token: s.token,
      leader: s.leader ? s.leader.node_id : null, leaseMs: s.lease_ttl_remaining_ms,
      budget: s.failure_budget || null,
    }));
  }
  return [{
    shard: 0, role: status.role, token: status.fence_token,
    leader: status.leader ? status.leader.node_id : null, leaseMs: status.lease_ttl_remaining_ms,
    budget: status.failure_budget || null,
  }];
}

// The /status of the node that answered (always up: it answered).
function ownStatus(fleet) {
  return fleet.members.find((m) => m.id === fleet.node_id)?.status || {};
}

// Per shard, who leads: the reachable member that says it leads (the highest token if a stale
// one still says so too), else whom most reachable members report ("reported": it may be
// unreachable from this node, or already gone).
function leadersOf(fleet) {
  const shards = [];
  for (let s = 0; s < fleet.shard_count; s++) shards.push({ shard: s, id: null, token: null, leaseMs: null, source: 'none', others: [] });
  const reports = shards.map(() => new Map());
  for (const m of fleet.members.filter((m) => m.up)) {
    for (const t of termsOf(m.status)) {
      const l = shards[t.shard];
      if (!l) continue;
      if (t.role === 'leader') {
        if (l.source !== 'claimed' || t.token > l.token) {
          if (l.source === 'claimed') l.others.push(l.id);
          Object.assign(l, { id: m.id, token: t.token, leaseMs: t.leaseMs, source: 'claimed' });
        } else {
          l.others.push(m.id);
        }
      } else if (t.leader) {
        reports[t.shard].set(t.leader, (reports[t.shard].get(t.leader) || 0) + 1);
      }
    }
  }
  shards.forEach((l, s) => {
    if (l.source !== 'none' || reports[s].size === 0) return;
    l.id = [...reports[s].entries()].sort((a, b) => b[1] - a[1])[0][0];
    l.source = 'reported';
  });
  return shards;
}

function leaderName(l) {
  if (l.id === null) return 'none';
  if (l.source === 'reported') return `${l.id} (reported, not reached)`;
  return `${l.id} (token ${l.token})`;
}

function noteChanges(leaders) {
  const before = page.lastLeaders;
  page.lastLeaders = leaders.map((l) => ({ id: l.id, token: l.token, source: l.source }));
  if (!before) {
    // Where the console's record of changes starts.
    console.info(`baton-ui leaders at open: ${leaders.map((l) => `shard ${l.shard}: ${leaderName(l)}`).join(', ')}`);
    return;
  }
  for (const l of leaders) {
    const was = before[l.shard];
    if (!was || (was.id === l.id && was.token === l.token && was.source === l.source)) continue;
    const text = `${clock(Date.now())} shard ${l.shard}: ${leaderName(was)} → ${leaderName(l)}`;
    page.changes.push({ shard: l.shard, from: was.id, to: l.id, text });
    // Also in the browser's console: a record that outlives what the list keeps.
    console.info(`baton-ui leadership change: ${text}`);
  }
  page.changes.splice(0, Math.max(0, page.changes.length - CHANGES_KEPT));
}

function leaseCell(ms) {
  const td = el('td', null, 'num');
  if (ms === null || ms === undefined) {
    td.textContent = '—';
    return td;
  }
  page.leaseScaleMs = Math.max(page.leaseScaleMs, ms);
  const bar = el('span', null, 'bar');
  bar.style.width = `${Math.round((60 * ms) / page.leaseScaleMs)}px`;
  td.append(bar, `${ms} ms`);
  return td;
}

function renderLeaders(fleet, leaders) {
  const owners = ownStatus(fleet).placement?.owners || [];
  const rows = leaders.map((l) => {
    const who = el('td', dash(l.id), l.source === 'claimed' ? 'leader' : 'muted');
    if (l.source === 'reported') who.append(el('span', ' (reported, not reached)', 'muted'));
    if (l.others.length) who.append(el('span', ` also says it leads: ${l.others.join(', ')}`, 'down'));
    const tr = row([el('td', l.shard), who, el('td', dash(l.token), 'num'), leaseCell(l.leaseMs), el('td', dash(owners[l.shard]))]);
    tr.dataset.shard = l.shard;
    tr.dataset.leader = l.id === null ? '' : l.id;
    tr.dataset.source = l.source;
    return tr;
  });
  document.querySelector('#leaders tbody').replaceChildren(...rows);
  // Placement exists only with shards.
  document.getElementById('leaders').classList.toggle('unsharded', fleet.shard_count === 1);
}

function renderMembers(fleet) {
  const sharded = fleet.shard_count > 1;
  const rows = fleet.members.map((m) => {
    let role = 'down';
    let cells;
    if (!m.up) {
      const state = el('td', 'down', 'down');
      state.append(el('span', ` ${m.error}`, 'muted'));
      cells = [state, el('td', '—'), el('td', '—'), el('td', '—'), el('td', '—')];
    } else {
      const terms = termsOf(m.status);
      const led = terms.filter((t) => t.role === 'leader');
      role = led.length ? 'leader'
        : terms.some((t) => t.role === 'budget_blocked') ? 'budget_blocked'
          : terms.some((t) => t.role === 'follower') ? 'follower' : 'candidate';
      const roleText = sharded ? (led.length ? `leads ${led.map((t) => t.shard).join(', ')}` : role) : role;
      const leases = led.map((t) => t.leaseMs).filter((ms) => ms !== null && ms !== undefined);
      const follows = [...new Set(terms.filter((t) => t.role !== 'leader' && t.leader).map((t) => t.leader))].sort();
      cells = [
        el('td', 'up', 'up'),
        el('td', roleText, role === 'leader' ? 'leader' : role === 'budget_blocked' ? 'down' : ''),
        el('td', led.length ? led.map((t) => (sharded ? `${t.shard}:${t.token}` : t.token)).join(' ') : '—', 'num'),
        leaseCell(leases.length ? Math.min(...leases) : null),
        el('td', follows.length ? follows.join(', ') : '—'),
      ];
    }
    const name = el('td', m.id, role === 'leader' ? 'leader' : '');
    if (m.id === fleet.node_id) name.append(el('span', ' (this node)', 'muted'));
    const tr = row([name, el('td', dash(m.addr)), ...cells]);
    tr.dataset.member = m.id;
    tr.dataset.up = String(m.up);
    tr.dataset.role = role;
    return tr;
  });
  document.querySelector('#members tbody').replaceChildren(...rows);
  document.getElementById('members-token').textContent = sharded ? 'tokens (shard:token)' : 'token';
}

function renderChanges() {
  const items = page.changes.slice().reverse().map((c) => {
    const li = el('li', c.text);
    li.dataset.shard = c.shard;
    li.dataset.from = c.from === null ? '' : c.from;
    li.dataset.to = c.to === null ? '' : c.to;
    return li;
  });
  document.getElementById('changes').replaceChildren(...items);
  document.getElementById('no-changes').hidden = items.length > 0;
}

function renderRejections(rejections) {
  const rows = rejections.rows.map((r) => {
    const tr = row([
      el('td', clock(r.at_unix_ms), 'num'), r.resource, r.op,
      `token ${r.token} from ${r.holder}`, `token ${r.max_token} by ${r.max_holder}`, r.reason,
    ]);
    tr.dataset.rejectedHolder = r.holder;
    tr.dataset.rejectedToken = r.token;
    return tr;
  });
  document.querySelector('#rejections tbody').replaceChildren(...rows);
  const note = document.getElementById('rejections-note');
  note.textContent = rejections.error ? `Unavailable: ${rejections.error}` : rows.length ? '' : 'None recorded.';
  document.getElementById('rejections').hidden = rows.length === 0;
}

function renderSummary(fleet, leaders) {
  const up = fleet.members.filter((m) => m.up).length;
  const members = `${up} of ${fleet.members.length} members up`;
  const body = document.body;
  let text;
  if (fleet.shard_count === 1) {
    const l = leaders[0];
    text = l.id === null ? `No leader · ${members}` : `Leader ${l.id} · token ${dash(l.token)} · ${members}`;
    body.dataset.leader = l.id === null ? '' : l.id;
  } else {
    const led = new Set(leaders.filter((l) => l.source === 'claimed').map((l) => l.id));
    const dark = leaders.filter((l) => l.source !== 'claimed').length;
    text = `${fleet.shard_count} shards, led by ${[...led].sort().join(', ') || 'nobody'}${dark ? ` · ${dark} without a reachable leader` : ''} · ${members}`;
  }
  document.getElementById('summary').textContent = text;
  body.dataset.membersUp = up;
  const backend = ownStatus(fleet).backend;
  document.getElementById('answered-by').textContent =
    `Answered by ${fleet.node_id} (backend ${dash(backend)}) at ${clock(Date.now())} · refreshed every ${POLL_EVERY_MS / 1000} s`;
}

// The failure budget, per shard, as the reachable member that read it last says it: shown
// while spent (the fleet does not campaign for that shard's work).
function renderBudget(fleet) {
  const spent = new Map();
  for (const m of fleet.members.filter((m) => m.up)) {
    for (const t of termsOf(m.status)) {
      const b = t.budget;
      if (!b) continue;
      const seen = spent.get(t.shard);
      if (!seen || b.checked_ms_ago < seen.checked_ms_ago) spent.set(t.shard, b);
    }
  }
  const lines = [...spent.entries()].filter(([, b]) => b.exhausted).sort((a, b) => a[0] - b[0]).map(([shard, b]) => {
    const where = fleet.shard_count > 1 ? `shard ${shard}: ` : '';
    const reopens = b.reopens_in_ms === null || b.reopens_in_ms === undefined ? '' : `; reopens in ${Math.ceil(b.reopens_in_ms / 1000)} s`;
    return `${where}failure budget spent (${b.failed_terms} of ${b.limit} failed terms within ${Math.round(b.window_ms / 1000)} s${reopens}, or \`baton budget reset\`): no node campaigns. Last failure: ${dash(b.last_failure)}`;
  });
  const p = document.getElementById('budget');
  p.textContent = lines.join(' · ');
  p.hidden = lines.length === 0;
  document.body.dataset.budget = lines.length ? 'spent' : '';
}

function render(fleet) {
  const leaders = leadersOf(fleet);
  noteChanges(leaders);
  renderSummary(fleet, leaders);
  renderBudget(fleet);
  renderLeaders(fleet, leaders);
  renderMembers(fleet);
  renderChanges();
  renderRejections(fleet.fence_rejections);
}

function showProblem(text) {
  const p = document.getElementById('problem');
  p.textContent = text;
  p.hidden = text === null;
}

async function poll() {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), POLL_TIMEOUT_MS);
  try {
    const answer = await fetch('/ui/fleet', { cache: 'no-store', signal: abort.signal });
    if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
    render(await answer.json());
    showProblem(null);
    page.polls += 1;
    document.body.dataset.polls = page.polls;
    document.body.dataset.state = 'ok';
  } catch (e) {
    showProblem(`This node did not answer at ${clock(Date.now())} (${e.message}); showing its last answer.`);
    document.body.dataset.state = 'stale';
  } finally {
    clearTimeout(timer);
    setTimeout(poll, POLL_EVERY_MS);
  }
}

poll();
