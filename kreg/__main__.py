from kreg.cli import main

raise SystemExit(main())
