"""Plots as standalone SVG, written here so the suite needs nothing beyond Python: line charts
over categorical x values (file sizes, job counts; evenly spaced, which is a log scale for
doubling series) with min-max whiskers, and grouped bar charts."""

import math
from html import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf"]
W, H = 760, 460
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 40, 100


def _nice_max(v):
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * exp >= v:
            return m * exp
    return 10 * exp


def _frame(title, xlabel, ylabel, ymax, xs, xpos):
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2 - RIGHT / 2}" y="22" text-anchor="middle" font-size="14" '
           f'font-weight="bold">{escape(title)}</text>']
    x0, x1, y0, y1 = LEFT, W - RIGHT, H - BOTTOM, TOP
    for i in range(6):
        v = ymax * i / 5
        y = y0 - (y0 - y1) * i / 5
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#ddd"/>')
        label = f"{v:.0f}" if ymax >= 10 else f"{v:.2f}"
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>')
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>')
    rotate = max(len(str(x)) for x in xs) * len(xs) * 7 > (x1 - x0)
    for x, px in zip(xs, xpos):
        if rotate:
            out.append(f'<text x="{px:.1f}" y="{y0 + 14}" text-anchor="end" '
                       f'transform="rotate(-35 {px:.1f} {y0 + 14})">{escape(str(x))}</text>')
        else:
            out.append(f'<text x="{px:.1f}" y="{y0 + 18}" text-anchor="middle">'
                       f'{escape(str(x))}</text>')
    out.append(f'<text x="{(x0 + x1) / 2}" y="{H - 12}" text-anchor="middle">'
               f'{escape(xlabel)}</text>')
    out.append(f'<text x="16" y="{(y0 + y1) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(y0 + y1) / 2})">{escape(ylabel)}</text>')
    return out


def _legend(out, names, styles=None):
    for i, name in enumerate(names):
        y = TOP + 10 + i * 18
        x = W - RIGHT + 14
        color = COLORS[i % len(COLORS)]
        dash = ' stroke-dasharray="5,3"' if styles and styles[i] == "dashed" else ""
        out.append(f'<line x1="{x}" y1="{y}" x2="{x + 22}" y2="{y}" stroke="{color}" '
                   f'stroke-width="2.5"{dash}/>')
        out.append(f'<text x="{x + 28}" y="{y + 4}">{escape(name)}</text>')


def parts(v):
    """A value as (median, lo, hi): a plain number has no whisker."""
    return (v, v, v) if not isinstance(v, tuple) else v


def _axes(title, xlabel, ylabel, xs, series):
    """The frame for SERIES over the categories XS: (SVG lines so far, x of each category,
    the step between them, a function from a value to its y)."""
    values = [parts(v)[2] for _, vs in series for v in vs if v is not None]
    ymax = _nice_max(max(values, default=1.0) * 1.05)
    x0, x1, y0, y1 = LEFT, W - RIGHT, H - BOTTOM, TOP
    step = (x1 - x0) / max(1, len(xs))
    xpos = [x0 + step * (i + 0.5) for i in range(len(xs))]

    def ypos(v):
        return y0 - (y0 - y1) * v / ymax
    return _frame(title, xlabel, ylabel, ymax, xs, xpos), xpos, step, ypos


def line(title, xlabel, ylabel, xs, series, styles=None):
    """SERIES: [(name, [value or (median, lo, hi) or None per x])]. Whiskers show lo-hi."""
    out, xpos, step, ypos = _axes(title, xlabel, ylabel, xs, series)
    for i, (name, vs) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        dash = ' stroke-dasharray="5,3"' if styles and styles[i] == "dashed" else ""
        pts = [(px, parts(v)) for px, v in zip(xpos, vs) if v is not None]
        if len(pts) > 1:
            path = " ".join(f"{px:.1f},{ypos(m):.1f}" for px, (m, _, _) in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                       f'stroke-width="2"{dash}/>')
        for px, (m, lo, hi) in pts:
            if hi > lo:
                out.append(f'<line x1="{px:.1f}" y1="{ypos(lo):.1f}" x2="{px:.1f}" '
                           f'y2="{ypos(hi):.1f}" stroke="{color}" stroke-width="1.2"/>')
                for v in (lo, hi):
                    out.append(f'<line x1="{px - 4:.1f}" y1="{ypos(v):.1f}" x2="{px + 4:.1f}" '
                               f'y2="{ypos(v):.1f}" stroke="{color}" stroke-width="1.2"/>')
            out.append(f'<circle cx="{px:.1f}" cy="{ypos(m):.1f}" r="3" fill="{color}"/>')
    _legend(out, [n for n, _ in series], styles)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def bars(title, xlabel, ylabel, groups, series):
    """Grouped bars: GROUPS are the x labels; SERIES [(name, [value or (median, lo, hi)])]."""
    out, xpos, step, ypos = _axes(title, xlabel, ylabel, groups, series)
    y0 = H - BOTTOM
    width = step * 0.8 / max(1, len(series))
    for i, (name, vs) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        for g, v in enumerate(vs):
            if v is None:
                continue
            m, lo, hi = parts(v)
            bx = xpos[g] - step * 0.4 + i * width
            out.append(f'<rect x="{bx:.1f}" y="{ypos(m):.1f}" width="{width * 0.9:.1f}" '
                       f'height="{max(0.0, y0 - ypos(m)):.1f}" fill="{color}"/>')
            if hi > lo:
                cx = bx + width * 0.45
                out.append(f'<line x1="{cx:.1f}" y1="{ypos(lo):.1f}" x2="{cx:.1f}" '
                           f'y2="{ypos(hi):.1f}" stroke="black" stroke-width="1"/>')
    _legend(out, [n for n, _ in series])
    out.append("</svg>")
    return "\n".join(out) + "\n"
