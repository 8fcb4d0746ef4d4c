from gateway.cli.main import main

raise SystemExit(main())
