// The activation vocabulary of gpu_core::nn::Activation in f32 (its f64 definitions, rounded
// a few times: see the bounds in tests/primitives.rs).
const NEG_INF_BITS: u32 = 0xff800000u;
fn is_ninf(x: f32) -> bool { return bitcast<u32>(x) == NEG_INF_BITS; }
// tanh that saturates for large |x| (some drivers' builtin gives NaN there).
fn tanh_(x: f32) -> f32 {
    let a = abs(x);
    if (a > 1.0) {
        let e = exp(-2.0 * a);
        return sign(x) * (1.0 - e) / (1.0 + e);
    }
    return tanh(x);
}
// ln x with IEEE's edge cases whatever the driver does outside the domain.
fn log_(x: f32) -> f32 {
    if (is_nan(x) || x < 0.0) { return bitcast<f32>(0x7fc00000u); }
    if (x == 0.0) { return bitcast<f32>(NEG_INF_BITS); }
    return log(x);
}
fn exp_(x: f32) -> f32 { return select(exp(x), x, is_nan(x)); }
// erfc, Numerical Recipes' erfcc (fractional error below 1.2e-7 everywhere); NaN stays NaN.
fn erfc_(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223
        + t * 0.17087277))))))));
    let r = t * exp(-z * z + p);
    return select(2.0 - r, r, x >= 0.0);
}
// Φ(x) = erfc(−x/√2)/2 and φ(x).
fn ncdf(x: f32) -> f32 { return 0.5 * erfc_(-x * 0.70710678118654752); }
fn npdf(x: f32) -> f32 { return 0.39894228040143268 * exp(-0.5 * x * x); }
fn sigm(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }
// x·t for a tail factor t: 0 where t is 0 (±inf·0 would be NaN).
fn times_tail(x: f32, t: f32) -> f32 { return select(x * t, 0.0, t == 0.0); }
fn silu_d(x: f32) -> f32 {
    let s = sigm(x);
    return select(s * (1.0 + times_tail(x, 1.0 - s)), 0.0, is_ninf(x));
}
