"""Moving the policy's weights into the engines: one module per transport, each with its sending and receiving half."""
