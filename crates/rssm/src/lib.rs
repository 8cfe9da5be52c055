//! `rssm`: the world model of hybrid-trainer (an RSSM: encoder + GRU ensemble) that will watch
//! training and predict the effect of the next steps. Not built yet: this crate has no API until
//! its own issue lands; it exists so the workspace has its final shape.
