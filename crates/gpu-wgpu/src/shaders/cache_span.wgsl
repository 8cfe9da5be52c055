// The slots query `idx` of [b, t, heads] sees, as [first, last) (empty where first >= last):
// from its row's start, up to its own slot (the row's slot plus its place among the t new
// queries), inside the window (p5, 0: none) and the cache (p4 slots). Shared by cache_attn
// and cache_combine, whose p1 = t and p2 = heads.
fn visible(idx: u32) -> vec2<u32> {
    let r = idx / (P.p1 * P.p2);
    let s = slot[r] + (idx / P.p2) % P.p1;
    var first = start[r];
    if (P.p5 != 0u && s + 1u > P.p5) { first = max(first, s + 1u - P.p5); }
    return vec2<u32>(first, min(s + 1u, P.p4));
}
