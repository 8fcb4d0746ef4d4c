from gateway.entry import main

raise SystemExit(main())
