//! `Tensor::backward_with`: the hook sees each leaf once, with its final gradient, and may
//! replace it (what a data-parallel trainer's bucketed averaging relies on).

use tensor_ops::{Device, Tensor};

fn leaf(v: Vec<f32>) -> Tensor {
    Tensor::from_vec(v, &[3], Device::Cpu)
        .unwrap()
        .requires_grad_()
        .unwrap()
}

/// loss = Σ (a·b + a + a) with a read three times: a's gradient is complete only after all
/// three reads have passed theirs back.
fn loss(a: &Tensor, b: &Tensor) -> Tensor {
    a.mul(b)
        .unwrap()
        .add(a)
        .unwrap()
        .add(a)
        .unwrap()
        .sum(0, false)
        .unwrap()
}

#[test]
fn the_hook_sees_each_final_gradient_once() {
    let (a, b) = (leaf(vec![1.0, -2.0, 0.5]), leaf(vec![3.0, 0.25, -1.0]));
    let plain = loss(&a, &b).backward().unwrap();
    let mut seen: Vec<(u64, Vec<f32>)> = Vec::new();
    let hooked = loss(&a, &b)
        .backward_with(&mut |t, g| {
            seen.push((t.id(), g.to_vec()?));
            Ok(())
        })
        .unwrap();
    assert_eq!(seen.len(), 2, "one call a leaf");
    for t in [&a, &b] {
        let want = plain.get(t).unwrap().to_vec().unwrap();
        let at_hook = &seen.iter().find(|s| s.0 == t.id()).unwrap().1;
        assert_eq!(at_hook, &want, "the hook saw a partial gradient");
        assert_eq!(hooked.get(t).unwrap().to_vec().unwrap(), want);
    }
    // d/da = b + 2, d/db = a
    assert_eq!(
        plain.get(&a).unwrap().to_vec().unwrap(),
        vec![5.0, 2.25, 1.0]
    );
    assert_eq!(
        plain.get(&b).unwrap().to_vec().unwrap(),
        vec![1.0, -2.0, 0.5]
    );
}

#[test]
fn a_replaced_gradient_is_the_one_returned_and_errors_stop_the_pass() {
    let (a, b) = (leaf(vec![1.0, -2.0, 0.5]), leaf(vec![3.0, 0.25, -1.0]));
    let grads = loss(&a, &b)
        .backward_with(&mut |_, g| {
            *g = g.mul_scalar(2.0)?;
            Ok(())
        })
        .unwrap();
    assert_eq!(
        grads.get(&a).unwrap().to_vec().unwrap(),
        vec![10.0, 4.5, 2.0]
    );
    let err = loss(&a, &b)
        .backward_with(&mut |_, _| Err(tensor_ops::GpuError::invalid("hook", "refused")))
        .err()
        .expect("the hook's error comes back");
    assert!(err.to_string().contains("refused"), "{err}");
}

/// A leaf's gradient is handed over as soon as its last reader is done, not at the leaf's
/// turn in the pass: in x·w1·w2·w3, w3 comes first and w1 (with x) last. A data-parallel
/// trainer's buckets then fill while the pass still runs.
#[test]
fn gradients_are_handed_over_as_soon_as_they_are_final() {
    let x = leaf(vec![1.0, 2.0, 3.0]);
    let w: Vec<Tensor> = (1..=3).map(|k| leaf(vec![k as f32; 3])).collect();
    let y = x
        .mul(&w[0])
        .unwrap()
        .mul(&w[1])
        .unwrap()
        .mul(&w[2])
        .unwrap();
    let mut seen = Vec::new();
    y.sum(0, false)
        .unwrap()
        .backward_with(&mut |t, _| {
            seen.push(t.id());
            Ok(())
        })
        .unwrap();
    let pos = |t: &Tensor| seen.iter().position(|&i| i == t.id()).unwrap();
    assert_eq!(seen.len(), 4);
    assert_eq!(pos(&w[2]), 0, "w3 is final first");
    assert_eq!(pos(&w[1]), 1);
    assert!(pos(&w[0]) >= 2 && pos(&x) >= 2);
}
