"""The report page's fixed parts: stylesheet (full width, re-flowing to 420 px) and the small table-sorting script
(inline: the page works offline)."""

CSS = """
:root { --ink:#111827; --muted:#6b7280; --line:#e5e7eb; --bg:#f8fafc; --card:#fff; --accent:#2563eb; --best:#dcfce7; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font:15px/1.55 Inter, system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; }
header { background:linear-gradient(120deg,#0f172a,#1e3a8a); color:#fff; padding:28px 0 22px; }
.wrap { max-width:none; margin:0 auto; padding:0 24px; }
header h1 { margin:0 0 4px; font-size:26px; font-weight:650; letter-spacing:-.01em; }
header p { margin:0; color:#cbd5e1; font-size:14px; }
nav { position:sticky; top:0; z-index:5; background:rgba(255,255,255,.92); backdrop-filter:blur(6px);
  border-bottom:1px solid var(--line); }
nav a { display:inline-block; padding:10px 12px; color:var(--muted); text-decoration:none; font-size:13px; font-weight:550; }
nav a:hover { color:var(--accent); }
section { background:var(--card); border:1px solid var(--line); border-radius:12px; margin:22px 0; padding:20px 24px;
  box-shadow:0 1px 2px rgba(15,23,42,.04); }
h2 { font-size:18px; margin:0 0 12px; font-weight:650; }
h3 { font-size:14px; margin:18px 0 6px; color:#374151; font-weight:600; }
p.note { color:var(--muted); font-size:13px; margin:6px 0 0; }
.verdict { font-size:17px; line-height:1.6; margin:0; }
.legend { display:flex; flex-wrap:wrap; gap:14px; margin-top:12px; font-size:13px; color:#374151; }
.chip { display:inline-block; width:11px; height:11px; border-radius:3px; margin-right:6px; vertical-align:-1px; }
.table-wrap { overflow-x:auto; border:1px solid var(--line); border-radius:8px; }
table { border-collapse:collapse; width:100%; font-size:13px; font-variant-numeric:tabular-nums; }
th, td { padding:7px 10px; border-bottom:1px solid var(--line); text-align:right; white-space:nowrap; }
thead th { background:#f1f5f9; color:#334155; font-weight:600; font-size:12px; text-align:center; }
thead tr:first-child th { border-bottom:1px solid #cbd5e1; }
tbody th { text-align:left; font-weight:600; position:sticky; left:0; background:#fff; }
th.sortable { cursor:pointer; user-select:none; }
th.sortable:hover { color:var(--accent); }
th.sorted-asc::after { content:" ▲"; } th.sorted-desc::after { content:" ▼"; }
.dir { color:#94a3b8; font-weight:400; }
td.best { background:var(--best); font-weight:650; color:#14532d; }
td small, th small { color:var(--muted); font-weight:400; }
thead th small { display:block; }
small.iv { display:block; font-size:11px; white-space:normal; max-width:24em; margin-left:auto; }
td.warn { background:#fef3c7; color:#92400e; }
sup.dagger { color:#b45309; font-weight:700; margin-left:1px; }
details.detail > summary { font-size:13px; }
details.detail .table-wrap { margin-top:8px; }
.group-title { font-size:20px; margin:30px 0 0; }
figure { margin:0 0 18px; }
.panels { display:grid; grid-template-columns:repeat(auto-fill, minmax(min(100%, 380px), 1fr)); gap:6px 18px; }
.panels.wide-panels { grid-template-columns:repeat(auto-fill, minmax(min(100%, 640px), 1fr)); }
.wide { overflow-x:auto; }
.wide svg.plot { min-width:560px; }
.wide-panels .panel { overflow-x:auto; }
.wide-panels svg.plot { min-width:560px; }
figcaption { color:var(--muted); font-size:13px; margin:2px 0 10px; }
svg.plot { width:100%; height:auto; display:block; }
dl.facts { display:grid; grid-template-columns:max-content 1fr; gap:4px 18px; margin:0; font-size:14px; }
dl.facts dt { color:var(--muted); } dl.facts dd { margin:0; }
code, pre { font-family:"JetBrains Mono", ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size:12.5px; }
pre { background:#0f172a; color:#e2e8f0; padding:12px 14px; border-radius:8px; overflow:auto; max-height:420px; }
.prov { display:inline-block; padding:1px 8px; border-radius:999px; font-size:12px; margin:0 6px 4px 0; }
.prov-measured { background:#dcfce7; color:#166534; } .prov-published { background:#dbeafe; color:#1e40af; }
.prov-derived { background:#fef9c3; color:#854d0e; } .prov-estimated { background:#fee2e2; color:#991b1b; }
details summary { cursor:pointer; color:var(--accent); font-size:13px; margin-top:10px; }
footer { color:var(--muted); font-size:12px; text-align:center; padding:10px 0 30px; }
@media (max-width:720px) {
  .wrap { padding:0 4px; } section { padding:10px 6px; margin:12px 0; } header h1 { font-size:21px; }
  table.deciding th, table.deciding td { padding:4px 3px; font-size:11.5px; white-space:normal; }
  table.deciding small { font-size:10px; }
  tbody th { position:static; }
}
"""

SORT_JS = """
(function () {
  Array.prototype.forEach.call(document.querySelectorAll('table.sortable-table'), function (table) {
    var body = table.tBodies[0];
    Array.prototype.forEach.call(table.querySelectorAll('th.sortable'), function (th) {
      th.title = 'click to sort';
      th.addEventListener('click', function () {
        var col = parseInt(th.getAttribute('data-col'), 10);
        var desc = !th.classList.contains('sorted-desc');
        Array.prototype.forEach.call(table.querySelectorAll('th.sortable'), function (h) {
          h.classList.remove('sorted-asc', 'sorted-desc');
        });
        th.classList.add(desc ? 'sorted-desc' : 'sorted-asc');
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
          var nx = parseFloat(x), ny = parseFloat(y);
          var c = (isNaN(nx) || isNaN(ny)) ? String(x).localeCompare(String(y)) : nx - ny;
          if (x === '' && y !== '') { return 1; }
          if (y === '' && x !== '') { return -1; }
          return desc ? -c : c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
    table.setAttribute('data-sortable', 'ready');
  });
})();
"""
