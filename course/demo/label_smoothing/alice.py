def my_label_smoothing(logits, target, eps_ls, pad_id):
    V = logits.size(-1)
    log_probs = torch.log_softmax(logits, dim=-1)
    # eps_ls spread over the V - 1 tokens other than <pad>, and 1 - eps_ls more on the true token
    q = torch.full_like(log_probs, eps_ls / (V - 1))
    q[..., pad_id] = 0.0
    q = q + (1.0 - eps_ls) * torch.nn.functional.one_hot(target, V).to(q.dtype)
    per_position = -(q * log_probs).sum(dim=-1)
    return per_position[target != pad_id].sum()
