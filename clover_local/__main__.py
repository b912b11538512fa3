from clover_local.cli import main

raise SystemExit(main())
