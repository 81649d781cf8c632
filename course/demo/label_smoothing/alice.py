def my_label_smoothing(logits, target, eps_ls, pad_id):
    V = logits.size(-1)
    q = torch.full_like(logits, eps_ls / (V - 1))
    q[..., pad_id] = 0.0
    q.scatter_add_(-1, target[..., None], torch.full_like(logits[..., :1], 1.0 - eps_ls))
    return -(q * logits.log_softmax(-1)).sum(-1).masked_fill(target == pad_id, 0.0).sum()
