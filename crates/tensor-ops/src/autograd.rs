//! Reverse-mode autograd: each op's result records its inputs and a backward closure; `backward`
//! walks the graph in reverse topological order, accumulating gradients.

use crate::tensor::Tensor;
use gpu_core::{GpuError, Result};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};

pub(crate) type BackwardFn =
    Box<dyn Fn(&Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// How an op's result was made.
pub(crate) struct Node {
    pub(crate) name: &'static str,
    pub(crate) inputs: Vec<Tensor>,
    /// `(output, grad of output) -> grad of each input`.
    pub(crate) backward: BackwardFn,
}

thread_local! {
    static NO_GRAD: Cell<u32> = const { Cell::new(0) };
}

pub(crate) fn grad_enabled() -> bool {
    NO_GRAD.with(|n| n.get() == 0)
}

/// Runs `f` without recording a graph (evaluation, optimiser updates, backward itself).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Guard;
    impl Drop for Guard {
        fn drop(&mut self) {
            NO_GRAD.with(|n| n.set(n.get() - 1));
        }
    }
    NO_GRAD.with(|n| n.set(n.get() + 1));
    let _g = Guard;
    f()
}

/// Gradients of the leaves (`requires_grad_` tensors) that a loss depends on.
#[derive(Default)]
pub struct Gradients {
    map: HashMap<u64, Tensor>,
}

impl Gradients {
    /// The gradient of `t`, if the loss depends on it.
    pub fn get(&self, t: &Tensor) -> Option<&Tensor> {
        self.map.get(&t.id())
    }

    /// Number of leaves with a gradient.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no leaf got a gradient.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl Tensor {
    /// Backpropagates from this scalar (one-element) tensor; returns the leaves' gradients.
    pub fn backward(&self) -> Result<Gradients> {
        self.backward_with(&mut |_, _| Ok(()))
    }

    /// [`Tensor::backward`], calling `on_leaf(leaf, gradient)` as soon as each leaf's gradient
    /// is final (every op that reads the leaf has passed its part back), in the order the pass
    /// finishes them (the same on every run of the same graph): a data-parallel trainer starts
    /// averaging those gradients across processes while the rest of the pass runs. `on_leaf`
    /// may replace the gradient (with a private copy, before changing it in place: a gradient
    /// can share its storage with one the pass still reads).
    pub fn backward_with(
        &self,
        on_leaf: &mut dyn FnMut(&Tensor, &mut Tensor) -> Result<()>,
    ) -> Result<Gradients> {
        if self.numel() != 1 {
            return Err(GpuError::shape(
                "backward",
                "a one-element loss",
                self.numel(),
            ));
        }
        if !self.requires_grad() {
            return Err(GpuError::invalid(
                "backward",
                "the loss does not depend on any parameter",
            ));
        }
        no_grad(|| {
            let order = topo_order(self);
            let mut grads: HashMap<u64, Tensor> = HashMap::new();
            let seed = Tensor::full_as(1.0, self.shape(), self.dtype(), self.device())?;
            grads.insert(self.id(), seed);
            let mut leaves = Gradients::default();
            // How many reads of each leaf are still to pass their part back: a leaf's gradient
            // is final (and handed to `on_leaf`) the moment its last reader is done, which in
            // the reverse order can be long before the leaf's own turn.
            let mut pending: HashMap<u64, usize> = HashMap::new();
            for t in &order {
                for inp in t.0.node.iter().flat_map(|n| &n.inputs) {
                    if inp.0.node.is_none() && inp.requires_grad() {
                        *pending.entry(inp.id()).or_default() += 1;
                    }
                }
            }
            let mut finish = |leaf: &Tensor,
                              grads: &mut HashMap<u64, Tensor>,
                              leaves: &mut Gradients|
             -> Result<()> {
                if let Some(mut g) = grads.remove(&leaf.id()) {
                    on_leaf(leaf, &mut g)?;
                    leaves.map.insert(leaf.id(), g);
                }
                Ok(())
            };
            for t in order.iter().rev() {
                let Some(node) = &t.0.node else {
                    // A leaf whose readers all passed nothing back, or the root itself.
                    finish(t, &mut grads, &mut leaves)?;
                    continue;
                };
                let Some(g) = grads.remove(&t.id()) else {
                    for inp in &node.inputs {
                        if let Some(n) = pending.get_mut(&inp.id()) {
                            *n -= 1;
                            if *n == 0 {
                                finish(inp, &mut grads, &mut leaves)?;
                            }
                        }
                    }
                    continue;
                };
                let input_grads = (node.backward)(t, &g)?;
                debug_assert_eq!(input_grads.len(), node.inputs.len(), "{}", node.name);
                for (inp, ig) in node.inputs.iter().zip(input_grads) {
                    let Some(ig) = ig else { continue };
                    if !inp.requires_grad() {
                        continue;
                    }
                    if ig.shape() != inp.shape() {
                        return Err(GpuError::shape(
                            node.name,
                            format!("gradient {:?}", inp.shape()),
                            format!("{:?}", ig.shape()),
                        ));
                    }
                    let acc = match grads.remove(&inp.id()) {
                        Some(prev) => prev.add(&ig)?,
                        None => ig,
                    };
                    grads.insert(inp.id(), acc);
                }
                for inp in &node.inputs {
                    if let Some(n) = pending.get_mut(&inp.id()) {
                        *n -= 1;
                        if *n == 0 {
                            finish(inp, &mut grads, &mut leaves)?;
                        }
                    }
                }
            }
            Ok(leaves)
        })
    }
}

/// Tensors reachable from `root` through graph nodes, inputs before outputs.
fn topo_order(root: &Tensor) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    // Iterative post-order DFS (graphs of deep models overflow a recursive one).
    let mut stack: Vec<(Tensor, bool)> = vec![(root.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !seen.insert(t.id()) {
            continue;
        }
        stack.push((t.clone(), true));
        if let Some(node) = &t.0.node {
            for inp in &node.inputs {
                if inp.requires_grad() && !seen.contains(&inp.id()) {
                    stack.push((inp.clone(), false));
                }
            }
        }
    }
    order
}
