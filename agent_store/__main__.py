from agent_store.cli import main

main()
