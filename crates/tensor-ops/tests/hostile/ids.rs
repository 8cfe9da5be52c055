//! Indices out of range: class targets of `cross_entropy` and token ids of `embedding`. The CPU
//! reported them, the CUDA kernels wrote NaN; both now fail with the same typed error, found on
//! the host from the bound a u32 tensor records when it is made from host data.

use super::devices;
use tensor_ops::{transfer_stats, Device, GpuError, Tensor};

fn out_of_range(what: &str, r: tensor_ops::Result<Tensor>, value: u32, bound: usize) -> String {
    match r {
        Err(e @ GpuError::IndexOutOfRange { .. }) => {
            let GpuError::IndexOutOfRange {
                value: v, bound: b, ..
            } = e
            else {
                unreachable!()
            };
            assert_eq!((v, b), (value, bound), "{what}");
            e.to_string()
        }
        other => panic!("{what}: expected IndexOutOfRange, got {other:?}"),
    }
}

#[test]
fn out_of_range_targets_and_ids_are_the_same_typed_error_on_every_device() {
    let mut messages: Vec<(Device, Vec<String>)> = Vec::new();
    for dev in devices("out_of_range_targets_and_ids_are_the_same_typed_error_on_every_device") {
        let mut msgs = Vec::new();
        let logits = Tensor::from_vec(vec![0.5f32; 6], &[2, 3], dev).unwrap();
        for (t, value) in [([0u32, 3], 3), ([u32::MAX, 1], u32::MAX)] {
            let targets = Tensor::from_vec(t.to_vec(), &[2], dev).unwrap();
            let what = format!("{dev}: cross_entropy targets {t:?}");
            msgs.push(out_of_range(
                &what,
                logits.cross_entropy(&targets),
                value,
                3,
            ));
            // Made on the CPU and moved: the bound travels with the copy.
            let moved = Tensor::from_vec(t.to_vec(), &[2], Device::Cpu)
                .unwrap()
                .to(dev)
                .unwrap();
            msgs.push(out_of_range(&what, logits.cross_entropy(&moved), value, 3));
        }
        let table = Tensor::from_vec(vec![1.0f32; 8], &[4, 2], dev)
            .unwrap()
            .requires_grad_()
            .unwrap();
        let ids = Tensor::from_vec(vec![1u32, 4, 0, 2], &[2, 2], dev).unwrap();
        let what = format!("{dev}: embedding ids");
        msgs.push(out_of_range(&what, table.embedding(&ids), 4, 4));
        // Through a view and a detached copy.
        let flat = ids.reshape(&[4]).unwrap();
        msgs.push(out_of_range(&what, table.embedding(&flat), 4, 4));
        msgs.push(out_of_range(&what, table.embedding(&ids.detach()), 4, 4));
        // In range: fine, and empty ids index even an empty table.
        let ok = Tensor::from_vec(vec![3u32, 0], &[2], dev).unwrap();
        assert_eq!(table.embedding(&ok).unwrap().shape(), [2, 2]);
        let none = Tensor::from_vec(Vec::<u32>::new(), &[0], dev).unwrap();
        let empty_table = Tensor::zeros(&[0, 2], dev).unwrap();
        assert_eq!(empty_table.embedding(&none).unwrap().shape(), [0, 2]);
        messages.push((dev, msgs));
    }
    for (dev, msgs) in &messages[1..] {
        assert_eq!(msgs, &messages[0].1, "{dev} and the CPU report differently");
    }
}

/// The check reads the bound recorded on the host, never the device: a loss over good and bad
/// ids moves no data (on CUDA a read would be a counted device-to-host copy).
#[test]
fn checking_ids_and_targets_moves_no_data_on_every_device() {
    for dev in devices("checking_ids_and_targets_moves_no_data_on_every_device") {
        let table = Tensor::from_vec(vec![0.25f32; 12], &[4, 3], dev)
            .unwrap()
            .requires_grad_()
            .unwrap();
        let ids = Tensor::from_vec(vec![1u32, 3, 0], &[3], dev).unwrap();
        let good = Tensor::from_vec(vec![2u32, 0, 1], &[3], dev).unwrap();
        let bad = Tensor::from_vec(vec![2u32, 3, 1], &[3], dev).unwrap();
        let bad_ids = Tensor::from_vec(vec![9u32], &[1], dev).unwrap();
        let before = transfer_stats();
        let logits = table.embedding(&ids).unwrap();
        let loss = logits.cross_entropy(&good).unwrap();
        let grads = loss.backward().unwrap();
        assert!(logits.cross_entropy(&bad).is_err());
        assert!(table.embedding(&bad_ids).is_err());
        let after = transfer_stats();
        assert_eq!(after.device_to_host, before.device_to_host, "{dev}");
        assert!(grads.get(&table).is_some());
    }
}
