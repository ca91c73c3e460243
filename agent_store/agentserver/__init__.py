"""Self-hosted Responses servers on the store (the ``agentserver`` extra):

    responses.py   StoreResponseProvider: azure-ai-agentserver-responses' ResponseProviderProtocol (migration 0018)
    history.py     a hosted response's history, read through the chain of responses it continues
    foundry.py     the session and checkpoint providers agent-framework-foundry-hosting's ResponsesHostServer takes

Each ended response's turn is also written to the store's own messages (agent_framework/served_transcripts.py).

Imported on their own (``from agent_store.agentserver.responses import StoreResponseProvider``): each needs its
package, and ``agent_store`` never imports them.
"""
