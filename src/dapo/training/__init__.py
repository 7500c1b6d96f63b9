"""The DAPO training loop (Algorithm 1) and the pieces only it uses: generation rounds, the dynamic-sampling
buffer, the train batch, the actor step, weight sync, run state, step metrics."""
